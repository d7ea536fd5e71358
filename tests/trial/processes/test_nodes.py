"""The placement of a trial's ranks and the launcher interface behind it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.trial.processes import launcher, nodes, placement
from autotune.trial.processes.placement import Placement


@pytest.fixture(autouse=True)
def no_placement_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (placement.NODES_ENV, placement.LAUNCHER_ENV, placement.SCHEDULER_ENV, placement.SCHEDULER_ARGS_ENV):
        monkeypatch.delenv(key, raising=False)


def test_unset_is_this_machine_alone() -> None:
    assert Placement.from_env() == Placement(1, "single-machine", None, ())


def test_a_placement_survives_the_environment() -> None:
    p = Placement(4, "torchx", "slurm", (("partition", "gpu"), ("time", "10")))
    assert Placement.from_env(p.to_env()) == p


@pytest.mark.parametrize(
    "nodes_arg, launcher_arg, args, phrase",
    [
        ("0", "torchx", [], "--nodes must be >= 1"),
        ("two", "torchx", [], "--nodes must be a whole number"),
        ("2", "ssh", [], "--launcher must be one of single-machine|torchx"),
        ("2", "torchx", ["partition"], "--scheduler-arg must be KEY=VALUE"),
        ("2", "torchx", ["a=1,b=2"], "--scheduler-arg must be KEY=VALUE"),
    ],
)
def test_malformed_placements(nodes_arg: str, launcher_arg: str, args: list[str], phrase: str) -> None:
    with pytest.raises(ConfigError, match=phrase):
        placement.parse(nodes_arg, launcher_arg, "local_cwd", args)


def test_one_machine_cannot_span_nodes() -> None:
    with pytest.raises(ConfigError, match="--nodes 2 needs a launcher that spans nodes"):
        nodes.check(Placement(2))
    with pytest.raises(ConfigError, match="--scheduler and --scheduler-arg need a multi-node launcher"):
        nodes.check(Placement(1, scheduler="slurm"))
    nodes.check(Placement())  # the default is fine


def test_one_node_commands_are_todays(tmp_path: Path) -> None:
    """With the default placement the launcher starts exactly what it always did."""
    worker = launcher.worker_args(tmp_path)
    assert launcher.command(TrialConfig(), tmp_path) == [sys.executable, "-m", "autotune.trial", *worker]
    assert launcher.command(TrialConfig(gpus=2), tmp_path) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "autotune.trial", *worker,
    ]  # fmt: skip
