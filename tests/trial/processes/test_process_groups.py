"""A trial's processes in other process groups than its leader's: torchrun starts each rank in its own
session, so the launcher finds, records and kills those groups too, and a dead controller still takes
its ranks with it. And the warm server's CUDA: a fork that lost the GPU fails loudly, never runs on CPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from collections.abc import Iterator

import psutil
import pytest
from torch.utils.data import Dataset

from autotune.core import errors
from autotune.core.files import write_json_atomic
from autotune.core.procs import CONTROLLER_ENV, process_identity
from autotune.trial.processes import launcher
from autotune.trial.processes.warm_client import CUDA_LOST_CAUSE, EXPECT_CUDA_ENV, NVML_CHECK_ENV, WarmServer
from autotune.trial.loop.worker import LAUNCH_TIME_ENV
from tests.conftest import live_processes, wait_until_gone
from tests.fakes import LIGHT_PRELOAD, fault_cfg
from tests.fault_pipelines import HANG_S, TinyPipeline
from tests.trial.processes.test_launcher import LauncherClock

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.side_by_side]


def gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The pids still alive (zombies count as dead) after up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if process_identity(p) is not None]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.fixture
def reaper() -> Iterator[list[str]]:
    """Markers whose processes the test SIGKILLs on its way out, whatever happened: a failing leak
    test must not leave its leak behind for the tests after it."""
    markers: list[str] = []
    yield markers
    for marker in markers:
        for p in live_processes(marker):
            try:
                p.kill()
            except psutil.Error:
                pass


# --- a process in a new session, no torch needed ------------------------------------------------------

SESSION_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]], "
    "start_new_session=True); time.sleep(600)"
)


def start_with_session_child(marker: str) -> tuple[subprocess.Popen[bytes], int]:
    """A leader (own group) whose child leads another session, as torchrun's ranks do; returns both."""
    proc = subprocess.Popen([sys.executable, "-c", SESSION_CHILD, marker], start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        child = [p.pid for p in live_processes(marker) if p.pid != proc.pid]
        if child:
            assert os.getpgid(child[0]) == child[0] != proc.pid  # its own group, not the leader's
            return proc, child[0]
        time.sleep(0.05)
    raise AssertionError("the leader never started its child")


def test_kill_group_kills_the_groups_of_the_leaders_descendants(tmp_path: Path, reaper: list[str]) -> None:
    marker = str(tmp_path / "marker")
    reaper.append(marker)
    proc, _ = start_with_session_child(marker)
    launcher.kill_group(proc, grace_s=1.0)
    assert proc.returncode == -signal.SIGTERM
    assert not wait_until_gone(marker, timeout_s=5), "the child in its own session outlived kill_group"


def test_groups_are_recorded_and_killed_after_the_leader_is_gone(tmp_path: Path, reaper: list[str]) -> None:
    marker = str(tmp_path / "marker")
    reaper.append(marker)
    proc, child = start_with_session_child(marker)
    seen: list[list[int]] = []
    groups = launcher.TrialGroups(proc.pid, tmp_path, seen.append)
    groups.refresh(force=True)
    groups.refresh(force=True)  # nothing new: no second report
    assert seen == [[child]] and groups.all() == [proc.pid, child]
    assert json.loads((tmp_path / launcher.GROUPS_FILE).read_text()) == {"leader": proc.pid, "groups": [child]}
    proc.kill()  # the leader dies alone (torchrun, SIGKILLed): its child is orphaned, unfindable
    proc.wait()
    launcher.kill_group(proc, grace_s=1.0, groups=groups)  # the launcher's cleanup, from the record
    assert not wait_until_gone(marker, timeout_s=5)


def test_die_with_parent_kills_a_process_whose_controller_is_already_dead(tmp_path: Path) -> None:
    # A rank that starts after torchrun (and the controller) died sets PR_SET_PDEATHSIG too late.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_identity = process_identity(dead.pid)
    dead.wait()
    me = process_identity(os.getpid())
    assert me is not None and dead_identity is not None and process_identity(dead.pid) is None
    reused = f"{os.getpid()}:{int(me.split(':')[1]) + 1}"  # this pid, but a different process's start time
    script = "from autotune.core.procs import die_with_parent; die_with_parent(); print('survived')"
    for controller, survives in ((me, True), (dead_identity, False), (reused, False), (None, True)):
        env = {k: v for k, v in os.environ.items() if k != CONTROLLER_ENV}
        if controller is not None:
            env[CONTROLLER_ENV] = controller
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
        assert (run.stdout == b"survived\n") is survives, (controller, run)
        assert run.returncode == (0 if survives else -signal.SIGKILL), (controller, run)


# --- real torchrun trials ---------------------------------------------------------------------------


class StuckLoaderWorker(TinyPipeline):
    """A rank whose loader worker gets stuck reading its second batch in a way SIGTERM can't end: a hung
    network filesystem puts a reader in uninterruptible (killable) sleep, where only SIGKILL gets
    through; here the worker ignores SIGTERM instead. torchrun forwards the launcher's SIGTERM to each
    rank's group: the rank dies, torchrun exits, the stuck worker lives on, orphaned, and never checks
    on its parent again. Only a SIGKILL to the rank's own group ends it. Each rank reports its pid,
    group and loader workers at each loss."""

    def build_dataset(self) -> Dataset[Any]:
        return _StuckAfterOneBatch(super().build_dataset(), self.cfg.batch_size)

    def loss(self, output: Any, target: Any) -> Any:
        report = os.environ["AUTOTUNE_TEST_PIDS"]
        me = psutil.Process()
        children = [c.pid for c in me.children(recursive=True)]
        pids = {
            "rank": int(os.environ["RANK"]),
            "pid": me.pid,
            "pgid": os.getpgid(0),
            "children": children,
            "children_pgids": [os.getpgid(c) for c in children],
        }
        with open(f"{report}.{me.pid}.tmp", "w") as f:
            json.dump(pids, f)
        os.replace(f"{report}.{me.pid}.tmp", f"{report}.{me.pid}")
        return super().loss(output, target)


class _StuckAfterOneBatch(Dataset[Any]):
    def __init__(self, inner: Any, good: int) -> None:
        self.inner, self.good, self.served = inner, good, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        from torch.utils.data import get_worker_info

        self.served += 1
        if get_worker_info() is not None and self.served > self.good:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (the worker's own handler would die of it)
            time.sleep(HANG_S)
        return self.inner[i]


def stuck_loader_worker(cfg: Any) -> StuckLoaderWorker:
    return StuckLoaderWorker(cfg)


def read_reports(prefix: Path, n: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [json.loads(p.read_text()) for p in prefix.parent.glob(f"{prefix.name}.*[0-9]")]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("end", ["pruned", "timeout"])
def test_a_torchrun_trial_leaves_no_rank_and_no_loader_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reaper: list[str], end: str
) -> None:
    report, trial_dir = tmp_path / "pids", tmp_path / "t"
    reaper.append(str(trial_dir))
    monkeypatch.setenv("AUTOTUNE_TEST_PIDS", str(report))
    clock = LauncherClock()
    monkeypatch.setattr(launcher, "time", clock)
    leaders: list[int] = []
    reports: list[dict[str, Any]] = []

    def on_window(step: int, samples_per_s: float) -> bool:
        # Step 1 is done on both ranks (its all-reduce needs them both), so each has reported and waits
        # for a batch its stuck loader worker will never deliver.
        reports[:] = read_reports(report, 2)
        if end == "timeout":
            clock.skip = 1e6  # the deadline passes at the next poll
        return end == "pruned"

    cfg = fault_cfg(
        "stuck_loader_worker",
        "tests.trial.processes.test_process_groups",
        gpus=2,
        num_workers=1,
        warmup_steps=0,
        window=1,
        timed_steps=1000,
    )
    with pytest.raises(errors.TrialPruned if end == "pruned" else errors.TrialTimeout):
        launcher.run_trial(cfg, trial_dir, timeout_s=300, on_window=on_window, on_start=leaders.append)
    assert sorted(r["rank"] for r in reports) == [0, 1], "the trial never reached its first loss"
    # The bug's precondition: each rank leads its own group, apart from torchrun's, with its loader worker.
    (torchrun,) = leaders
    assert all(r["pgid"] == r["pid"] != torchrun for r in reports), (torchrun, reports)
    assert all(len(r["children"]) == 1 and r["children_pgids"] == [r["pid"]] for r in reports), reports
    pids = [torchrun, *(pid for r in reports for pid in (r["pid"], *r["children"]))]
    left = wait_until_gone(str(trial_dir))
    assert not left, [(p.pid, p.info.get("cmdline")) for p in left]
    assert not gone(pids)
    recorded = json.loads((trial_dir / launcher.GROUPS_FILE).read_text())
    assert recorded["leader"] == torchrun and {r["pgid"] for r in reports} <= set(recorded["groups"])


CONTROLLER = """
import json, sys
from pathlib import Path
from autotune.core.config import TrialConfig
from autotune.trial.processes import launcher
launcher.run_trial(TrialConfig.from_dict(json.loads(sys.argv[1])), Path(sys.argv[2]), timeout_s=600)
"""


@pytest.mark.slow
def test_a_killed_controller_leaves_no_torchrun_and_no_rank(tmp_path: Path, reaper: list[str]) -> None:
    # The chain controller -> torchrun -> rank: PR_SET_PDEATHSIG at each link (the launcher's preexec_fn,
    # the worker's die_with_parent); loader workers notice their rank's death by polling (every 5 s).
    report, trial_dir = tmp_path / "pids", tmp_path / "t"
    reaper.append(str(trial_dir))
    cfg = fault_cfg("hang_loss_reporting", gpus=2, num_workers=1, warmup_steps=0, window=1)
    env = {**os.environ, "AUTOTUNE_TEST_PIDS": str(report)}
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, json.dumps(cfg.to_dict()), str(trial_dir)], env=env
    )
    try:
        reports = read_reports(report, 2, timeout_s=120)
        assert sorted(r["rank"] for r in reports) == [0, 1], "the ranks never reached their hang"
        torchrun = [p.pid for p in psutil.Process(controller.pid).children()]
        recorded = json.loads((trial_dir / launcher.GROUPS_FILE).read_text())
        assert recorded["leader"] == torchrun[0] and {r["pid"] for r in reports} <= set(recorded["groups"])
    finally:
        controller.kill()  # SIGKILL: no finally, no kill_group; only PR_SET_PDEATHSIG cleans up
        controller.wait()
    pids = [*torchrun, *(pid for r in reports for pid in (r["pid"], *r["children"]))]
    assert not gone(pids, timeout_s=20)
    assert not wait_until_gone(str(trial_dir), timeout_s=5)


# --- the warm server and CUDA -----------------------------------------------------------------------

WARM_PRELOAD = LIGHT_PRELOAD  # conftest's `server` fixture; its children import tests.fault_pipelines


def server_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


@pytest.mark.slow
def test_the_server_checks_cuda_through_nvml(server: WarmServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert server_env(server.pid)[NVML_CHECK_ENV] == "1"
    monkeypatch.setenv(NVML_CHECK_ENV, "0")  # the user's choice wins
    with WarmServer.start(preload=()) as chosen:
        assert server_env(chosen.pid)[NVML_CHECK_ENV] == "0"


def spawn(server: WarmServer, trial_dir: Path, **env: str) -> Any:
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(trial_dir / "config.json", fault_cfg("tiny").to_dict())
    full = {**os.environ, LAUNCH_TIME_ENV: repr(time.time()), "PYTHONUNBUFFERED": "1", **env}
    return server.spawn(launcher.worker_args(trial_dir), full, os.getcwd(), trial_dir / "trial.log")


@pytest.mark.slow
def test_a_fork_that_expects_cuda_and_has_none_fails_loudly(server: WarmServer, tmp_path: Path) -> None:
    # On this CPU machine a request that expects CUDA is exactly a fork that lost it.
    p = spawn(server, tmp_path / "lost", **{EXPECT_CUDA_ENV: "1"})
    assert p.wait(timeout=120) == errors.ExitCode.ERROR
    verdict = json.loads((tmp_path / "lost" / "result.json").read_text())
    assert verdict["status"] == "error" and verdict["cause"] == CUDA_LOST_CAUSE
    with pytest.raises(errors.TrialCrashed, match=r"warm fork lost CUDA.*--cold-start"):
        launcher._classify(p.returncode, tmp_path / "lost", tmp_path / "lost" / "trial.log", [])
    log = (tmp_path / "lost" / "trial.log").read_text()
    assert "lost CUDA" in log and "samples/s" not in log  # said so, and never trained on the CPU
    # The same request without the expectation is an ordinary CPU trial.
    p = spawn(server, tmp_path / "cpu")
    assert p.wait(timeout=120) == 0, (tmp_path / "cpu" / "trial.log").read_text()
    assert json.loads((tmp_path / "cpu" / "result.json").read_text())["device"] == "cpu"


@pytest.mark.slow
def test_the_launcher_retries_a_cuda_losing_fork_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EXPECT_CUDA_ENV, "1")  # as if the controller saw a GPU the fork can't
    starts: list[int] = []
    with WarmServer.start(LIGHT_PRELOAD) as s:
        r = launcher.run_trial(fault_cfg("tiny"), tmp_path / "t", timeout_s=180, server=s, on_start=starts.append)
        assert r.status == "ok" and s.cuda_lost
        log = (tmp_path / "t" / "trial.log").read_text()
        assert log.index("warm fork lost CUDA") < log.index("retrying this trial cold") < log.index("samples/s")
        assert len(starts) == 2 and starts[0] != starts[1]  # on_start again, for the cold process
        # Later trials don't try the server again: it would fork the same broken state.
        r = launcher.run_trial(fault_cfg("tiny"), tmp_path / "t2", timeout_s=180, server=s)
        assert r.status == "ok"
        assert "earlier warm fork lost CUDA" in (tmp_path / "t2" / "trial.log").read_text()


def test_the_launcher_expects_cuda_when_the_controller_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_torch(available: bool) -> Any:
        return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: available))

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = {"A": "1"}
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True))
    assert launcher._with_cuda_expectation(env) == {"A": "1", EXPECT_CUDA_ENV: "1"}
    assert launcher._with_cuda_expectation({**env, EXPECT_CUDA_ENV: "0"})[EXPECT_CUDA_ENV] == "0"  # explicit wins
    assert EXPECT_CUDA_ENV not in launcher._with_cuda_expectation({**env, "CUDA_VISIBLE_DEVICES": ""})
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    assert launcher._with_cuda_expectation(env) == env
    monkeypatch.delitem(sys.modules, "torch")  # not imported by the controller: not imported for this
    assert launcher._with_cuda_expectation(env) == env
