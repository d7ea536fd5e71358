"""Where a trial's ranks run, as a setting: how many nodes, and which launcher starts their ranks.

A `Placement` is a setting of the session, not a searched knob: the allocation is what it is. A trial
with `gpus: G` on `nodes: N` runs N x G ranks. The CLI validates the placement before anything is
written (exit 2, one line) and hands it to the launcher, and to every process it starts, through the
environment (`to_env`), so a search, its workers' trials, confirmation and parity all run alike.

`NodeLauncher` is what every way of starting ranks implements (autotune.trial.processes.nodes lists
them); it lives here, below them all, so a launcher's module and the list of launchers never import
each other.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autotune.core.errors import ConfigError

NODES_ENV = "AUTOTUNE_NODES"
LAUNCHER_ENV = "AUTOTUNE_NODE_LAUNCHER"
SCHEDULER_ENV = "AUTOTUNE_NODE_SCHEDULER"
SCHEDULER_ARGS_ENV = "AUTOTUNE_NODE_SCHEDULER_ARGS"  # "key=value,key=value": the scheduler's own run options

SINGLE = "single-machine"
LAUNCHERS = (SINGLE, "torchx")  # autotune.trial.processes.nodes holds one factory per name


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
    if launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher must be one of {'|'.join(LAUNCHERS)}, got {launcher!r}")
    pairs = []
    for arg in scheduler_args:
        key, eq, value = arg.partition("=")
        if not eq or not key or "," in arg:
            raise ConfigError(f"--scheduler-arg must be KEY=VALUE (no commas), got {arg!r}")
        pairs.append((key, value))
    return Placement(n, launcher, scheduler, tuple(pairs))


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
