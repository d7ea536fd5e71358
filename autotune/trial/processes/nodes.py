"""The ways of starting a trial's ranks, one `NodeLauncher` each: `single-machine` (torchrun --standalone,
the default) and `torchx` (autotune/trial/processes/torchx_nodes.py: one API over local, Slurm and
Kubernetes schedulers). Another one (Ray, plain srun) is one more class with `check` and `command`, one
name in placement.LAUNCHERS and one line in `_FACTORIES`.

The placement itself (how many nodes, which launcher) is autotune.trial.processes.placement.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from autotune.core.errors import ConfigError
from autotune.trial.processes.placement import LAUNCHERS, SINGLE, NodeLauncher, Placement
from autotune.trial.processes.torchx_nodes import TorchX  # its module imports torchx only when it is used


def python_for(gpus: int) -> list[str]:
    """The interpreter a trial or training run starts with on one machine: under torchrun, one rank per
    GPU, when gpus > 1."""
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus)]
    return [sys.executable]


class SingleMachine:
    """torchrun --standalone on this machine: one node, one rank per GPU."""

    name = SINGLE

    def check(self, placement: Placement) -> None:
        if placement.nodes != 1:
            raise ConfigError(
                f"--nodes {placement.nodes} needs a launcher that spans nodes (--launcher torchx); "
                f"{SINGLE} runs one node"
            )
        if placement.scheduler is not None or placement.scheduler_args:
            raise ConfigError("--scheduler and --scheduler-arg need a multi-node launcher (--launcher torchx)")

    def command(self, placement: Placement, gpus: int, trial_dir: Path, worker: list[str]) -> list[str]:
        return [*python_for(gpus), "-m", "autotune.trial", *worker]


_FACTORIES: dict[str, Callable[[], NodeLauncher]] = {SINGLE: SingleMachine, "torchx": TorchX}
assert tuple(_FACTORIES) == LAUNCHERS


def launcher_for(placement: Placement) -> NodeLauncher:
    return _FACTORIES[placement.launcher]()


def check(placement: Placement) -> None:
    """Everything wrong with a placement, as one ConfigError, before anything is written."""
    launcher_for(placement).check(placement)
