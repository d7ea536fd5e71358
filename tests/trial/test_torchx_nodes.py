"""Trials across nodes through TorchX: two simulated nodes on this machine (local_cwd) over gloo."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from autotune.core import errors
from autotune.core.errors import ConfigError
from autotune.trial import launcher, nodes, torchx_nodes
from autotune.trial.nodes import Placement
from tests.conftest import live_processes, wait_until_gone
from tests.fakes import fault_cfg
from tests.trial.test_launcher import assert_nothing_left
from tests.trial.test_process_groups import CONTROLLER, gone, read_reports

pytest.importorskip("torchx")
pytestmark = pytest.mark.usefixtures("repo_on_path")

TWO_LOCAL = Placement(2, "torchx", "local_cwd")
KILL_TO_END_S = 30.0  # the bound: a node's failure ends the trial on every node within this


@pytest.fixture
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Placement:
    for key, value in TWO_LOCAL.to_env().items():
        monkeypatch.setenv(key, value)
    return TWO_LOCAL


# --- the app TorchX runs --------------------------------------------------------------------------


def test_every_node_runs_torchrun_with_the_c10d_rendezvous() -> None:
    app = torchx_nodes.app_def(2, 3, "slurm", ["--config", "c.json"], rdzv_port=29500)
    (role,) = app.roles
    assert role.num_replicas == 2 and role.entrypoint == "bash"
    line = role.args[1]
    assert line.startswith(f"{sys.executable} -m torch.distributed.run ")  # this interpreter's torch, not PATH's
    for flag in ("--nnodes 2", "--nproc_per_node 3", "--rdzv_backend c10d", "-m autotune.trial --config c.json"):
        assert flag in line
    assert "--rdzv_id '${app_id}'" in line  # the scheduler fills in the app's own id: one rendezvous per trial
    assert ":=localhost}:29500" in line  # the first node's host, as the scheduler names it


def test_kubernetes_keeps_the_images_torchrun() -> None:
    line = torchx_nodes.app_def(2, 1, "kubernetes", [], rdzv_port=29500).roles[0].args[1]
    assert line.startswith("torchrun ")


def test_the_launcher_command_is_the_supervisor(tmp_path: Path) -> None:
    placement = Placement(2, "torchx", "slurm", (("partition", "gpu"),))
    cmd = torchx_nodes.TorchX().command(placement, 4, tmp_path, ["--config", "x"])
    assert cmd[:3] == [sys.executable, "-m", "autotune.trial.torchx_nodes"]
    assert cmd[cmd.index("--nodes") + 1] == "2" and cmd[cmd.index("--gpus") + 1] == "4"
    assert "--scheduler-arg=partition=gpu" in cmd and cmd[-3:] == ["--", "--config", "x"]


# --- what the supervisor watches ------------------------------------------------------------------


def test_a_failed_verdict_on_any_rank_is_seen(tmp_path: Path) -> None:
    assert torchx_nodes.failed_verdict(tmp_path) is None
    (tmp_path / "result.json").write_text(json.dumps({"status": "ok"}))
    assert torchx_nodes.failed_verdict(tmp_path) is None
    (tmp_path / "result.json.rank3").write_text(json.dumps({"status": "oom", "message": "x"}))
    assert torchx_nodes.failed_verdict(tmp_path) == "oom"


def test_a_failed_replica_the_scheduler_reports_is_seen() -> None:
    def status(*states: str) -> Any:
        replicas = [SimpleNamespace(id=i, state=SimpleNamespace(name=s)) for i, s in enumerate(states)]
        return SimpleNamespace(roles=[SimpleNamespace(replicas=replicas)])

    assert torchx_nodes.failed_node(status("RUNNING", "RUNNING"), []) is None
    assert torchx_nodes.failed_node(status("RUNNING", "FAILED"), []) == "node 1 failed"


def test_a_failed_local_node_is_seen() -> None:
    def replica(i: int, code: int | None) -> Any:
        return SimpleNamespace(replica_id=i, proc=SimpleNamespace(poll=lambda: code))

    assert torchx_nodes.failed_node(SimpleNamespace(roles=[]), [replica(0, None), replica(1, 0)]) is None
    assert (
        torchx_nodes.failed_node(SimpleNamespace(roles=[]), [replica(0, None), replica(1, 1)]) == "node 1 exited with 1"
    )


# --- bad input: exit 2 material, nothing started ---------------------------------------------------


@pytest.mark.parametrize(
    "placement, phrase",
    [
        (Placement(2, "torchx", None), "--launcher torchx needs --scheduler"),
        (Placement(2, "torchx", "nope"), "not a TorchX scheduler"),
        (Placement(10_000, "torchx", "local_cwd"), "simulates each node on this machine"),
        (Placement(2, "torchx", "local_cwd", (("no_such_opt", "1"),)), "not a local_cwd run option"),
    ],
)
def test_what_torchx_cannot_provide_is_bad_input(placement: Placement, phrase: str) -> None:
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(ConfigError, match=phrase):
        nodes.check(placement)
    # Making TorchX's local scheduler installs its own handlers: a controller keeps its own.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers


def test_slurm_without_its_commands_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchx_nodes.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="sbatch not found"):
        nodes.check(Placement(2, "torchx", "slurm"))


def test_torchx_not_installed_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchx.schedulers", None)  # import fails as if absent
    with pytest.raises(ConfigError, match="torchx is not installed"):
        nodes.check(TWO_LOCAL)


# --- real trials: two nodes of one rank each, simulated on this machine, over gloo ------------------


@pytest.mark.slow
def test_a_two_node_trial_passes(two_nodes: Placement, tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    r = launcher.run_trial(fault_cfg("slow", timed_steps=4), trial_dir, timeout_s=240)
    assert r.world_size == 2  # each rank knew it was one of two, on nodes of one rank each
    assert r.samples_per_s is not None and r.samples_per_s > 0
    assert not list(trial_dir.glob("result.json.rank*"))  # global rank 0 alone reports
    log = (trial_dir / "trial.log").read_text()
    assert "node 0" in log and "node 1" in log  # each node's own log ends up in the trial's
    assert_nothing_left(trial_dir)


def rank_processes(trial_dir: Path, rank: int) -> list[psutil.Process]:
    """The worker processes of global rank `rank` (not torchrun's agents, nor the bash that starts them)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or ())
            if str(trial_dir) in line and "torch.distributed.run" not in line and "bash" not in line:
                if p.environ().get("RANK") == str(rank):
                    found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def kill_rank_mid_trial(trial_dir: Path, rank: int, pipeline: str, module: str) -> tuple[BaseException, float]:
    """Run a long trial on two nodes; at its first throughput window SIGKILL global rank `rank` (the only
    rank of one node). Returns the failure and the seconds from the kill to the trial's end."""
    killed: list[float] = []

    def on_window(step: int, rate: float) -> bool:
        if not killed:
            victims = rank_processes(trial_dir, rank)
            assert len(victims) == 1, victims
            victims[0].send_signal(signal.SIGKILL)
            killed.append(time.monotonic())
        return False

    cfg = fault_cfg(pipeline, module=module, timed_steps=2000)  # ~200 s of steps: far longer than the bound
    with pytest.raises(errors.TrialFailure) as failure:
        launcher.run_trial(cfg, trial_dir, timeout_s=240, on_window=on_window)
    assert killed, "the trial ended before its first window"
    return failure.value, time.monotonic() - killed[0]


@pytest.mark.slow
def test_killing_one_nodes_rank_ends_the_trial_on_both_nodes(two_nodes: Placement, tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    failure, seconds = kill_rank_mid_trial(trial_dir, 1, "slow", "tests.fault_pipelines")
    print(f"trial ended on both nodes {seconds:.1f} s after rank 1 was killed")
    assert seconds < KILL_TO_END_S, seconds
    assert failure.reason == "crash"  # the survivor's "connection closed", or the lost node's exit: a FAIL
    assert_nothing_left(trial_dir)


@pytest.mark.slow
def test_a_lost_node_ends_a_peer_that_torch_would_not_wake(two_nodes: Placement, tmp_path: Path) -> None:
    """Rank 0 (node 0) sleeps outside any collective, so no gloo error ever reaches it: only the watch on
    the nodes, which sees node 1 exit, can end it before the trial's timeout."""
    trial_dir = tmp_path / "t"
    failure, seconds = kill_rank_mid_trial(trial_dir, 1, "hang_rank0", "tests.trial.node_fault_pipelines")
    print(f"trial ended on both nodes {seconds:.1f} s after rank 1 was killed (rank 0 asleep)")
    assert seconds < KILL_TO_END_S, seconds
    assert failure.reason == "crash"
    assert "cancelling the trial on every node" in (trial_dir / "trial.log").read_text()
    assert_nothing_left(trial_dir)


@pytest.mark.slow
def test_an_oom_on_one_node_is_oom(two_nodes: Placement, tmp_path: Path) -> None:
    """Rank 1 (node 1) runs out of memory, rank 0 (node 0) is left in the all-reduce: the named cause wins."""
    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialOOM):
        launcher.run_trial(fault_cfg("oom_rank1"), trial_dir, timeout_s=240)
    assert_nothing_left(trial_dir)


@pytest.mark.slow
def test_a_timeout_cancels_every_node(two_nodes: Placement, tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    start = time.monotonic()
    with pytest.raises(errors.TrialTimeout):
        launcher.run_trial(fault_cfg("hang_loss"), trial_dir, timeout_s=25)
    print(f"timed out trial ended {time.monotonic() - start - 25:.1f} s after its 25 s timeout")
    assert time.monotonic() - start < 25 + 15
    assert_nothing_left(trial_dir)


@pytest.mark.slow
def test_a_killed_controller_leaves_no_node_behind(two_nodes: Placement, tmp_path: Path) -> None:
    """SIGKILL the controller mid-trial: no finally, no kill_group. The supervisor's PR_SET_PDEATHSIG
    (SIGTERM) makes it cancel the app on every node."""
    report, trial_dir = tmp_path / "pids", tmp_path / "t"
    cfg = fault_cfg("hang_loss_reporting", warmup_steps=0, window=1)
    env = {**os.environ, "AUTOTUNE_TEST_PIDS": str(report)}
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, json.dumps(cfg.to_dict()), str(trial_dir)], env=env
    )
    try:
        reports = read_reports(report, 2, timeout_s=120)
        assert sorted(r["rank"] for r in reports) == [0, 1], "the ranks never reached their hang"
        controller.kill()  # SIGKILL: no finally, no kill_group
        controller.wait()
        start = time.monotonic()
        assert not gone([r["pid"] for r in reports], timeout_s=KILL_TO_END_S)
        print(f"ranks of both nodes gone {time.monotonic() - start:.1f} s after the controller was killed")
        assert not wait_until_gone(str(trial_dir), timeout_s=10)
    finally:
        controller.kill()
        controller.wait()
        for p in live_processes(str(trial_dir)):  # a failing leak test must not leave its leak behind
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_the_placement_reaches_the_launcher(two_nodes: Placement, tmp_path: Path) -> None:
    cmd = launcher.command(fault_cfg("tiny"), tmp_path)
    assert cmd[:3] == [sys.executable, "-m", "autotune.trial.torchx_nodes"]
    assert os.environ[nodes.NODES_ENV] == "2"
