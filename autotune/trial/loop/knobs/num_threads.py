"""num_threads' torch side (its story: autotune/core/knobs/num_threads.py): the count set before the job runs
(`set_up`), and the one it runs on read back (`seen`).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import os

import torch

from autotune.core.config import TrialConfig
from autotune.core.cpus import usable_cpus
from autotune.core.knobs.num_threads import NAME as NAME


def _ranks_on_this_node() -> int | None:
    """How many torchrun ranks share this machine's cores; None for a plain process."""
    n = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE")
    return int(n) if n else None


def set_up(cfg: TrialConfig) -> None:
    """The thread count set before the job runs: the config's, else under torchrun the ranks' share."""
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    elif (share := _share()) is not None:
        torch.set_num_threads(share[0])


def seen(cfg: TrialConfig) -> tuple[int, str]:
    """The count the process runs on now, and why (a `seen` pair): read after the set-up, and again after a
    script ran (it may set its own)."""
    if cfg.num_threads > 0:
        why = f"torch.set_num_threads({cfg.num_threads})"
    elif (share := _share()) is not None:
        why = share[1]
    else:
        why = "0 = torch default"
    return torch.get_num_threads(), why


def _share() -> tuple[int, str] | None:
    """Under torchrun, each rank's share of the cores, and why; None for a plain process. torchrun sets
    OMP_NUM_THREADS=1 in every rank when it is unset, so "torch's default" would mean all cores for gpus=1
    but one thread per rank under DDP: a bias against DDP. The ranks on this node get an equal share of the
    cores this process may run on instead: its affinity mask, capped by the container's CPU quota (two ranks
    in an 8-CPU pod on a 64-core host: 4 each)."""
    if (ranks := _ranks_on_this_node()) is None:
        return None
    cpus = usable_cpus()
    why = f"0 = the {cpus} usable cores (affinity, CPU quota) shared by the {ranks} ranks on this node"
    return max(1, cpus // ranks), why
