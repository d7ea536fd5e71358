"""Where a trial's ranks run: on this machine (torchrun --standalone), or across nodes through a launcher.

A `Placement` is a setting of the session, not a searched knob: the allocation is what it is. A trial
with `gpus: G` on `nodes: N` runs N x G ranks. The CLI validates the placement before anything is
written (exit 2, one line) and hands it to the launcher, and to every process it starts, through the
environment (`to_env`), so a search, its workers' trials, confirmation and parity all run alike.

Each way of starting ranks is a `NodeLauncher`: `single-machine` (today's torchrun --standalone, the
default) and `torchx` (autotune/trial/processes/torchx_nodes.py: one API over local, Slurm and Kubernetes
schedulers). Another one (Ray, plain srun) is one more class with `check` and `command`, and one line
in `_FACTORIES`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autotune.core.errors import ConfigError

NODES_ENV = "AUTOTUNE_NODES"
LAUNCHER_ENV = "AUTOTUNE_NODE_LAUNCHER"
SCHEDULER_ENV = "AUTOTUNE_NODE_SCHEDULER"
SCHEDULER_ARGS_ENV = "AUTOTUNE_NODE_SCHEDULER_ARGS"  # "key=value,key=value": the scheduler's own run options

SINGLE = "single-machine"


@dataclass(frozen=True)
class Placement:
    """How many nodes a trial spans, and what starts its ranks there."""

    nodes: int = 1
    launcher: str = SINGLE
    scheduler: str | None = None  # the launcher's scheduler (torchx: local_cwd, slurm, kubernetes, ...)
    scheduler_args: tuple[tuple[str, str], ...] = ()

    def to_env(self) -> dict[str, str]:
        env = {NODES_ENV: str(self.nodes), LAUNCHER_ENV: self.launcher}
        if self.scheduler is not None:
            env[SCHEDULER_ENV] = self.scheduler
        if self.scheduler_args:
            env[SCHEDULER_ARGS_ENV] = ",".join(f"{k}={v}" for k, v in self.scheduler_args)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Placement:
        """The session's placement; unset, this machine alone (today's behaviour)."""
        env = os.environ if env is None else env
        return parse(
            env.get(NODES_ENV, "1"),
            env.get(LAUNCHER_ENV, SINGLE),
            env.get(SCHEDULER_ENV) or None,
            [a for a in env.get(SCHEDULER_ARGS_ENV, "").split(",") if a],
        )


def parse(nodes: str | int, launcher: str, scheduler: str | None, scheduler_args: list[str]) -> Placement:
    """The CLI's --nodes/--launcher/--scheduler/--scheduler-arg as a Placement; ConfigError when malformed."""
    try:
        n = int(nodes)
    except ValueError:
        raise ConfigError(f"--nodes must be a whole number of nodes, got {nodes!r}") from None
    if n < 1:
        raise ConfigError(f"--nodes must be >= 1, got {n}")
    if launcher not in _FACTORIES:
        raise ConfigError(f"--launcher must be one of {'|'.join(_FACTORIES)}, got {launcher!r}")
    pairs = []
    for arg in scheduler_args:
        key, eq, value = arg.partition("=")
        if not eq or not key or "," in arg:
            raise ConfigError(f"--scheduler-arg must be KEY=VALUE (no commas), got {arg!r}")
        pairs.append((key, value))
    return Placement(n, launcher, scheduler, tuple(pairs))


def python_for(gpus: int) -> list[str]:
    """The interpreter a trial or training run starts with on one machine: under torchrun, one rank per
    GPU, when gpus > 1."""
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus)]
    return [sys.executable]


class NodeLauncher(Protocol):
    """Starts one trial's ranks: `command` is the one process the trial launcher runs, waits for (with
    its timeout) and kills by process group; it must end, with a non-zero code, as soon as any rank or
    node fails, and take every node's ranks with it when it is signalled."""

    name: str

    def check(self, placement: Placement) -> None:
        """Raise ConfigError (exit 2) if this launcher cannot provide the placement. Writes nothing."""
        ...

    def command(self, placement: Placement, gpus: int, trial_dir: Path, worker: list[str]) -> list[str]:
        """The command that runs `python -m autotune.trial *worker` on every rank of the trial."""
        ...


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


def _torchx() -> NodeLauncher:
    from autotune.trial.processes.torchx_nodes import TorchX  # its module imports torchx only when it is used

    return TorchX()


_FACTORIES: dict[str, Callable[[], NodeLauncher]] = {SINGLE: SingleMachine, "torchx": _torchx}
LAUNCHERS = tuple(_FACTORIES)


def launcher_for(placement: Placement) -> NodeLauncher:
    return _FACTORIES[placement.launcher]()


def check(placement: Placement) -> None:
    """Everything wrong with a placement, as one ConfigError, before anything is written."""
    launcher_for(placement).check(placement)
