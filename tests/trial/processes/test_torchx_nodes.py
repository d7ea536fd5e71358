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
import torch

from autotune.cli import main as cli_main
from autotune.core import errors
from autotune.core.errors import ConfigError
from autotune.trial.processes import launcher, nodes, placement, torchx_nodes
from autotune.trial.processes.nodes import Placement
from autotune.trial.processes.warm_client import EXPECT_CUDA_ENV
from tests.conftest import live_processes, wait_until_gone
from tests.fakes import fault_cfg
from tests.trial.processes.test_launcher import LauncherClock, assert_nothing_left
from tests.trial.processes.test_process_groups import CONTROLLER, gone, read_reports

pytest.importorskip("torchx")
pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.side_by_side]

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


def test_the_launcher_command_is_the_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXPECT_CUDA_ENV, raising=False)
    placement = Placement(2, "torchx", "slurm", (("partition", "gpu"),))
    cmd = torchx_nodes.TorchX().command(placement, 4, tmp_path, ["--config", "x"])
    assert cmd[:3] == [sys.executable, "-m", "autotune.trial.processes.torchx_nodes"]
    assert cmd[cmd.index("--nodes") + 1] == "2" and cmd[cmd.index("--gpus") + 1] == "4"
    assert "--scheduler-arg=partition=gpu" in cmd and cmd[-3:] == ["--", "--config", "x"]
    assert "--cuda" not in cmd  # this machine sees no GPU: nor do the trial's nodes need one


def test_a_controller_that_sees_cuda_asks_the_nodes_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EXPECT_CUDA_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as the study's fingerprint saw it
    cmd = torchx_nodes.TorchX().command(Placement(2, "torchx", "slurm"), 4, tmp_path, ["--config", "x"])
    assert "--cuda" in cmd[: cmd.index("--")]
    monkeypatch.setenv(EXPECT_CUDA_ENV, "0")  # said explicitly: wins
    assert "--cuda" not in torchx_nodes.TorchX().command(Placement(2, "torchx", "slurm"), 4, tmp_path, [])


# --- what each node asks its scheduler for -----------------------------------------------------------

WORKER = ["--config", "/t/config.json", "--out", "/t/result.json", "--progress", "/t/progress.jsonl"]


def this_machine() -> tuple[int, int]:
    return len(os.sched_getaffinity(0)), psutil.virtual_memory().total // 2**20


def test_each_node_asks_for_the_trials_gpus_cpus_and_memory() -> None:
    """TorchX's defaults are 2 CPUs, no GPU and 1 GiB: on Slurm the trial would run on a node's CPU."""
    app = torchx_nodes.app_def(2, 4, "slurm", WORKER, rdzv_port=29500, cuda=True)
    (role,) = app.roles
    cpus, mem_mb = this_machine()
    assert (role.resource.gpu, role.resource.cpu, role.resource.memMB) == (4, cpus, mem_mb)
    from torchx.runner import get_runner

    with torchx_nodes._signals_kept(), get_runner() as runner:  # the sbatch script TorchX would submit
        script = runner.dryrun(app, "slurm", cfg={}).request.materialize()
    for opt in ("--gpus-per-task=4", f"--cpus-per-task={cpus}", f"--mem={mem_mb}", "--ntasks-per-node=1"):
        assert opt in script, opt


def test_a_cpu_study_asks_for_no_gpu() -> None:
    (role,) = torchx_nodes.app_def(2, 2, "slurm", WORKER, rdzv_port=29500).roles
    assert role.resource.gpu == 0 and role.resource.cpu == this_machine()[0]
    assert role.entrypoint == "bash"  # no node check: nothing to check


def test_the_user_chooses_the_image_cpus_and_memory() -> None:
    settings = {"image": "registry.example/autotune:1.0", "cpu": "16", "memMB": "64000"}
    app = torchx_nodes.app_def(2, 8, "kubernetes", WORKER, rdzv_port=29500, cuda=True, settings=settings)
    (role,) = app.roles
    assert role.image == "registry.example/autotune:1.0"
    assert (role.resource.gpu, role.resource.cpu, role.resource.memMB) == (8, 16, 64000)
    assert role.entrypoint == "python3" and role.args[-3:-1] == ["bash", "-c"]  # the image's python ...
    assert role.args[-1].startswith("torchrun ")  # ... and its torchrun


def dry_run_replicas(app: Any, tmp_path: Path) -> list[Any]:
    """Each simulated node's process as TorchX's local scheduler would start it (macros filled in)."""
    from torchx.runner import get_runner

    with torchx_nodes._signals_kept(), get_runner() as runner:  # its local scheduler sets signal handlers
        request = runner.dryrun(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")}).request
    (replicas,) = request.role_params.values()
    return replicas


def fake_cuda(monkeypatch: pytest.MonkeyPatch, machine_gpus: int) -> list[tuple[str | None, list[str]]]:
    """A machine with `machine_gpus` GPUs, seen as CUDA sees them (CUDA_VISIBLE_DEVICES names which);
    exec is recorded: (CUDA_VISIBLE_DEVICES, argv) per node."""

    def count() -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return machine_gpus
        ids = [v for v in visible.split(",") if v]
        return len(ids) if all(v.isdigit() and int(v) < machine_gpus for v in ids) else 0

    execs: list[tuple[str | None, list[str]]] = []

    def execvp(file: str, argv: list[str]) -> None:
        execs.append((os.environ.get("CUDA_VISIBLE_DEVICES"), argv))
        raise Execed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count() > 0)
    monkeypatch.setattr(torch.cuda, "device_count", count)
    monkeypatch.setattr(torchx_nodes.os, "execvp", execvp)
    return execs


class Execed(Exception):
    """The node went on to its torchrun (exec replaces the process: nothing returns)."""


def run_nodes(replicas: list[Any]) -> list[int | str]:
    """Each node's check, as the scheduler starts it: "exec" where it went on to its torchrun, else its exit code."""
    codes: list[int | str] = []
    for replica in replicas:
        assert replica.args[1:4] == ["-m", "autotune.trial.processes.torchx_nodes", "node"]
        try:
            codes.append(torchx_nodes.node_main(replica.args[4:]))
        except Execed:
            codes.append("exec")
    return codes


@pytest.mark.parametrize("visible, want", [(None, ["0,1", "2,3"]), ("4,5,6,7", ["4,5", "6,7"])])
def test_simulated_nodes_each_get_their_own_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str | None, want: list[str]
) -> None:
    """On local_cwd every node would otherwise see every GPU, and each node's local rank 0 take cuda:0."""
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)  # this worker's own GPUs: its nodes stay on them
    app = torchx_nodes.app_def(2, 2, "local_cwd", WORKER, rdzv_port=29500, cuda=True)
    assert app.roles[0].resource.gpu == 2
    replicas = dry_run_replicas(app, tmp_path)
    execs = fake_cuda(monkeypatch, machine_gpus=8)
    assert run_nodes(replicas) == ["exec", "exec"]
    assert [seen for seen, _ in execs] == want
    for _, argv in execs:  # then each node runs its torchrun, as it would have without the check
        assert argv[:2] == ["bash", "-c"] and argv[2].startswith(f"{sys.executable} -m torch.distributed.run ")
        assert "--nproc_per_node 2" in argv[2]


def test_a_node_without_cuda_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study was fingerprinted on GPUs; a node that sees none would measure its CPU and record it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker = ["--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "result.json")]
    app = torchx_nodes.app_def(2, 2, "local_cwd", worker, rdzv_port=29500, cuda=True)
    execs = fake_cuda(monkeypatch, machine_gpus=2)  # GPUs 0 and 1 for node 0; node 1 gets 2,3: none exist
    assert run_nodes(dry_run_replicas(app, tmp_path)) == ["exec", int(errors.ExitCode.ERROR)]
    assert [seen for seen, _ in execs] == ["0,1"]  # node 1 never started its torchrun
    verdict = json.loads((tmp_path / "result.json.node1").read_text())
    assert verdict["status"] == "error" and verdict["cause"] == torchx_nodes.NODE_CHECK_CAUSE
    assert "node 1 sees 0 CUDA device(s) for its 2 rank(s)" in verdict["message"]
    assert "fingerprinted on GPUs" in verdict["message"]
    assert torchx_nodes.failed_verdict(tmp_path) == "error"  # what the supervisor's watch cancels on


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
        (Placement(2, "torchx", "kubernetes"), "runs each node from an image"),
        (Placement(2, "torchx", "aws_batch"), "--scheduler-arg image=IMAGE"),
        (Placement(2, "torchx", "kubernetes", (("image", " "),)), "image= is empty"),
        (Placement(2, "torchx", "local_cwd", (("cpu", "two"),)), "cpu=two: must be a whole number"),
        (Placement(2, "torchx", "local_cwd", (("memMB", "0"),)), "memMB=0: must be a whole number >= 1"),
    ],
)
def test_what_torchx_cannot_provide_is_bad_input(placement: Placement, phrase: str) -> None:
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(ConfigError, match=phrase):
        nodes.check(placement)
    # Making TorchX's local scheduler installs its own handlers: a controller keeps its own.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers


def test_node_settings_are_not_taken_for_run_options() -> None:
    nodes.check(Placement(2, "torchx", "local_cwd", (("cpu", "1"), ("memMB", "2048"), ("log_dir", "/tmp/x"))))


def test_kubernetes_without_an_image_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for key in (placement.NODES_ENV, placement.LAUNCHER_ENV, placement.SCHEDULER_ENV, placement.SCHEDULER_ARGS_ENV):
        monkeypatch.delenv(key, raising=False)  # the CLI sets them; restored after the test
    config = tmp_path / "c.yaml"
    config.write_text("batch_size: 4\n")
    argv = ["trial", "--config", str(config), "--nodes", "2", "--launcher", "torchx", "--scheduler", "kubernetes"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scheduler-arg image=IMAGE" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # nothing written


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


@pytest.mark.slow
def test_a_gpu_study_refuses_nodes_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Told the study runs on GPUs, on this machine without one: each node refuses before its torchrun,
    and the trial fails with the reason, not a CPU figure. The node's CPUs are a setting, not a run option."""
    placement = Placement(2, "torchx", "local_cwd", (("cpu", "1"),))
    for key, value in placement.to_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(EXPECT_CUDA_ENV, "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialCrashed, match=r"node \d sees 0 CUDA device\(s\) for its 1 rank"):
        launcher.run_trial(fault_cfg("tiny"), trial_dir, timeout_s=240)
    assert not (trial_dir / "result.json").exists()  # no rank ran: no figure
    log = (trial_dir / "trial.log").read_text()
    assert "fingerprinted on GPUs: refused" in log  # the node's own line, in the trial's log
    assert "auto_set_cuda_visible_devices" not in log  # TorchX's warning that no node sets its devices: each does
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
def test_a_timeout_cancels_every_node(two_nodes: Placement, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both nodes' ranks hang in their second loss; the trial's deadline is then made to pass (the launcher's
    clock skipped ahead, rather than waiting out a real timeout): every node's processes are cancelled."""
    report, trial_dir = tmp_path / "pids", tmp_path / "t"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDS", str(report))
    clock = LauncherClock()
    monkeypatch.setattr(launcher, "time", clock)
    reports: list[dict[str, Any]] = []
    passed: list[float] = []

    def on_window(step: int, rate: float) -> bool:
        reports[:] = read_reports(report, 2, timeout_s=60)  # each node's rank, hanging
        passed.append(time.monotonic())
        clock.skip = 1e6
        return False

    cfg = fault_cfg("hang_loss_reporting", warmup_steps=0, window=1)
    with pytest.raises(errors.TrialTimeout):
        launcher.run_trial(cfg, trial_dir, timeout_s=240, on_window=on_window)
    assert passed and sorted(r["rank"] for r in reports) == [0, 1], "the ranks never reached their hang"
    print(f"timed out trial ended {time.monotonic() - passed[0]:.1f} s after its deadline passed")
    assert time.monotonic() - passed[0] < 15
    assert_nothing_left(trial_dir, [r["pid"] for r in reports])


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
    assert cmd[:3] == [sys.executable, "-m", "autotune.trial.processes.torchx_nodes"]
    assert os.environ[placement.NODES_ENV] == "2"
