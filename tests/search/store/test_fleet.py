"""Many workers, one PostgreSQL-backed study (and Optuna's gRPC storage proxy). Needs a real server:
.ci/run starts one and exports AUTOTUNE_TEST_POSTGRES_URL; without it these tests are skipped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.search.store.storage import open_storage
from tests.fakes import free_port

PG = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
REPO_ROOT = Path(__file__).resolve().parents[3]
TINY = "tests.fault_pipelines:tiny"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not PG, reason="AUTOTUNE_TEST_POSTGRES_URL not set")]
SECRET = PG.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1] if PG and "@" in PG else "never-set"


@pytest.fixture
def fleet(tmp_path: Path):
    """A fresh study on the server, created the way users do: `autotune search --create-only`."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "AUTOTUNE_HEARTBEAT_S": "1",
        "AUTOTUNE_LOCK_DIR": str(tmp_path / "locks"),
        "PYTHONPATH": str(REPO_ROOT),  # the tiny test pipeline: what a fleet shares does not depend on the model
    }
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    outputs: list[str] = []

    def run(*args: str, seconds: str = "1", timeout: float = 300) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "autotune", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        outputs.append(r.stdout + r.stderr)
        return r

    def worker(*args: str, storage: str = PG or "") -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autotune",
                "worker",
                "--storage",
                storage,
                "--study",
                name,
                "--pipeline",
                TINY,
                *args,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def create(trial_seconds: str = "1", *extra: str) -> None:
        # No confirmation or parity unless a test asks: the last worker would run them after its trials.
        extra = extra or ("--confirm-rounds", "0", "--parity-steps", "0")
        r = run(
            "search",
            "--create-only",
            "--budget",
            "1h",
            "--storage",
            PG or "",
            "--study",
            name,
            "--pipeline",
            TINY,
            "--trial-seconds",
            trial_seconds,
            "--warmup-steps",
            "1",
            *extra,
        )
        assert r.returncode == 0, r.stderr

    def study() -> optuna.Study:
        return optuna.load_study(study_name=name, storage=open_storage(PG))

    yield type(
        "Fleet",
        (),
        {
            "run": staticmethod(run),
            "worker": staticmethod(worker),
            "create": staticmethod(create),
            "study": staticmethod(study),
            "outputs": outputs,
            "tmp": tmp_path,
            "name": name,
        },
    )
    # The password never appears in anything autotune printed or wrote.
    assert all(SECRET not in out for out in outputs)
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log", ".yaml", ".txt", ".jsonl"):
            assert SECRET not in path.read_text(errors="replace"), path


def finish(procs: list[subprocess.Popen[str]], fleet, timeout: float = 400) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        fleet.outputs.append(out)
        assert p.returncode == 0, out[-3000:]


def test_three_workers_share_one_study(fleet) -> None:
    fleet.create()
    t0 = time.monotonic()
    finish([fleet.worker("--n-trials", "2") for _ in range(3)], fleet)
    wall = time.monotonic() - t0
    trials = fleet.study().get_trials()
    numbers = [t.number for t in trials]
    ran = [t for t in trials if t.state.is_finished()]
    assert len(numbers) == len(set(numbers)) and len(ran) == 6  # every trial recorded exactly once
    # Three workers on one machine contend for its CPUs: a contended trial is queued once more, and
    # such re-measurements may be left WAITING when the workers' --n-trials are spent.
    assert all(t.state.is_finished() or t.user_attrs.get("retry_of") is not None for t in trials)
    roles = [t.user_attrs.get("role") for t in trials if t.user_attrs.get("retry_of") is None]
    assert roles.count("baseline") == 1 and roles.count("warm_start") == 1
    print(f"three workers: {len(trials)} trials in {wall:.1f} s, duplicates 0")


def test_killed_worker_trial_failed_by_others(fleet) -> None:
    # Long enough to be seen running and killed mid-trial; the survivor reruns it. fp32 only: the rerun is
    # the one finished trial, and with the check off a bf16 warm start (this CPU's) could not be exported.
    space = fleet.tmp / "space.yaml"
    space.write_text("knobs:\n  precision: fp32\n")
    fleet.create("8", "--confirm-rounds", "0", "--parity-steps", "0", "--space", str(space))
    victim = fleet.worker("--n-trials", "1")
    deadline = time.monotonic() + 120
    running = None
    while time.monotonic() < deadline and running is None:  # wait until its trial process is up
        time.sleep(0.5)
        running = next(
            (
                t
                for t in fleet.study().get_trials(states=(TrialState.RUNNING,))
                if "pgid" in t.user_attrs.get("owner", {})
            ),
            None,
        )
    assert running is not None, "the worker never started a trial"
    pgid = running.user_attrs["owner"]["pgid"]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    time.sleep(4)  # past the heartbeat grace period (3 x 1 s)
    with pytest.raises(ProcessLookupError):  # PR_SET_PDEATHSIG took the trial down with its worker
        for _ in range(20):
            os.killpg(pgid, 0)
            time.sleep(0.5)
    finish([fleet.worker("--n-trials", "1", "--budget", "5m")], fleet)
    trials = fleet.study().trials
    assert trials[running.number].state == TrialState.FAIL
    # RetryHeartbeatStaleTrialCallback queued it again (same config and role), and the survivor finished.
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retried) == 1 and retried[0].user_attrs["config"] == running.user_attrs["config"]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 1


def test_storage_proxy_serves_two_workers(fleet) -> None:
    fleet.create()
    port = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "autotune", "storage-proxy", "--storage", PG or "", "--port", str(port)],
        cwd=fleet.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(60):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        finish([fleet.worker("--n-trials", "1", storage=f"grpc://127.0.0.1:{port}") for _ in range(2)], fleet)
    finally:
        proxy.terminate()
        out, _ = proxy.communicate(timeout=10)
        fleet.outputs.append(out)
    done = [t for t in fleet.study().get_trials() if t.state.is_finished()]
    assert len(done) == 2


def test_the_last_worker_to_finish_confirms_once(fleet) -> None:
    # One round asked for is raised to the 3 a gain needs (core/paired.MIN_ROUNDS), and said so.
    fleet.create("1", "--confirm-rounds", "1", "--confirm-top", "1", "--parity-steps", "0")
    slow = fleet.worker("--n-trials", "5")  # registers in the study first, and is still running when...
    time.sleep(3)
    quick = fleet.worker("--n-trials", "1")  # ...this one finishes: it must leave confirmation to the other
    finish([quick], fleet)
    first = fleet.outputs[-1]
    assert "confirming:" not in first and "other workers are still running" in first, first[-2000:]
    finish([slow], fleet)
    last = fleet.outputs[-1]
    assert "confirming:" in last, last[-2000:]
    summary = fleet.study().user_attrs.get("confirmation")
    assert "confirmation: 3 rounds, not 1" in last, last[-2000:]
    # 3 rounds; 3 more of the exported config beside the baseline when the noise left the confirmed
    # one without a measurable gain and the export fell to one the rounds did not measure (confirm.extend).
    extended = last.count("confirming the exported")
    assert summary and summary["rounds"] == 3 * (1 + extended) and summary["winner"] is not None
