"""A search survives every trial fault, a killed controller, Ctrl-C/SIGTERM and concurrent searches."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware
from autotune.search.space.reading import load_space
from autotune.search.store.storage import open_storage
from autotune.search.store.results import feasible
from autotune.search.loop.runner import Events, run_one
from autotune.search.loop.study import open_study
from autotune.trial.processes.warm_client import WarmServer
from tests.conftest import REPO_ROOT, wait_until_gone

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)
FP = {
    "gpu_names": [],
    "gpu_count": 0,
    "cpu_model": "test",
    "cpu_cores": 2,
    "torch": "x",
    "cuda": None,
    "pipeline": "tests.fault_pipelines:fault_by_batch_size",
    "image_size": 64,
}
PIPELINE = "tests.fault_pipelines:fault_by_batch_size"
# A hanging trial's timeout: a forked trial starts in well under a second, so the timeout is the hang's.
HANG_TIMEOUT_S = 4.0


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_every_fault_is_classified_and_the_search_goes_on(tmp_path: Path, server: WarmServer) -> None:
    """Each trial forks from a warm server, as a search's do; a forked trial's command line does not name
    it, so what it leaves behind is looked for by its process group too."""
    base = TrialConfig(pipeline=PIPELINE, warmup_steps=1, timed_steps=6, window=2)
    settings = SearchSettings(
        budget_s=600, storage=str(tmp_path / "studies.db"), studies_dir=str(tmp_path / "studies"), base=base
    )
    space = for_hardware(load_space(REPO_ROOT / "search_spaces" / "default.yaml"), CPU, stages=2)[0]
    study = open_study(settings, open_storage(settings.storage), FP, space, CPU)
    cases = [  # (knobs, expected state, reason)
        (dict(batch_size=3), "infeasible", "oom"),
        (dict(batch_size=5), "infeasible", "numerics"),
        (dict(batch_size=2, channels_last=True), "infeasible", "unsupported"),
        (dict(batch_size=6), TrialState.FAIL, "crash"),
        (dict(batch_size=8, num_workers=1), TrialState.FAIL, "crash"),
        (dict(batch_size=7), TrialState.FAIL, "timeout"),
        # Timed out before its first measured window while compiling: a property of the config.
        (dict(batch_size=7, compile="default"), "infeasible", "compile_timeout"),
        # The same, cut short by the end of the budget (timeout below --trial-timeout): says nothing.
        (dict(batch_size=7, compile="default"), TrialState.FAIL, "budget"),
        (dict(batch_size=2), TrialState.COMPLETE, None),  # and the search goes on
    ]
    for knobs, expected, reason in cases:
        trial = study.ask()
        timeout = HANG_TIMEOUT_S if reason in ("timeout", "compile_timeout", "budget") else 120.0
        # --trial-timeout HANG_TIMEOUT_S: every timeout is the trial's own; the budget case cuts there, of 120 s
        run_settings = dataclasses.replace(settings, trial_timeout_s=HANG_TIMEOUT_S if reason != "budget" else 120.0)
        frozen = run_one(study, trial, base.replace(**knobs), run_settings, timeout, Events(), server)
        marker = str(tmp_path / "studies" / "autotune" / f"trial-{trial.number}")
        assert wait_until_gone(marker) == [], f"trial {trial.number} left processes behind"
        assert group_gone(frozen.user_attrs["owner"]["pgid"]), f"trial {trial.number} left its group behind"
        if expected == "infeasible":
            assert frozen.state == TrialState.COMPLETE and not feasible(frozen)
            assert frozen.constraints == {"infeasible": 1.0}
        else:
            assert frozen.state == expected
        assert frozen.user_attrs.get("reason") == reason, frozen.user_attrs
        if reason in ("crash", "timeout", "compile_timeout", "budget", "oom"):
            assert frozen.user_attrs["log_tail"]
    assert "signal" in study.trials[-6].user_attrs["message"] or "killed" in study.trials[-6].user_attrs["message"]
    assert "torch.compile (default) had not finished" in study.trials[-3].user_attrs["message"]
    assert "budget ended" in study.trials[-2].user_attrs["message"]
    # An infeasible trial is never the best.
    best = max((t for t in study.trials if feasible(t)), key=lambda t: t.value)
    assert best.params.get("batch_size", 2) == 2 and best.user_attrs["config"]["batch_size"] == 2


def _search(
    tmp_path: Path, *extra: str, sigint: Any = signal.SIG_DFL, trial_seconds: float = 3
) -> subprocess.Popen[str]:
    """`autotune search` in a subprocess. `sigint` is the SIGINT disposition it inherits: a shell's
    background job starts with SIGINT ignored, and Ctrl-C must work however autotune was started.
    3-second trials by default: long enough to find one running and stop it mid-trial."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HUB_OFFLINE": "1",
        "AUTOTUNE_LOCK_DIR": str(tmp_path / "locks"),
    }
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--pipeline",
        "tests.fault_pipelines:slow",
        "--trial-seconds",
        str(trial_seconds),
        "--warmup-steps",
        "1",
        *extra,
    ]
    return subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )


def group_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    """Trials fork from a warm server, so their command line doesn't name them: check the group."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def in_group(pgid: int) -> list[str]:
    """What is left in a process group, for a failure's message: pid, parent, status and command line."""
    left = []
    for p in psutil.process_iter(["pid", "ppid", "status", "cmdline"]):
        try:
            if os.getpgid(p.pid) == pgid:
                left.append(
                    f"{p.pid} (parent {p.info['ppid']}, {p.info['status']}): {' '.join(p.info['cmdline'] or [])[:120]}"
                )
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


def left_in(cwd: Path, timeout_s: float = 15.0) -> list[psutil.Process]:
    """Processes still working in this test's folder: the controller, warm server and trials all do."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE and Path(p.cwd()) == cwd:
                    left.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))


def _wait_running(tmp_path: Path, completed: int, timeout_s: float = 120) -> optuna.trial.FrozenTrial:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if not (tmp_path / "studies.db").exists():
            continue
        try:
            trials = _study(tmp_path).get_trials()
        except KeyError:  # the journal file exists a moment before the search creates its study in it
            continue
        done = sum(t.state.is_finished() for t in trials)
        running = [t for t in trials if t.state == TrialState.RUNNING and "pgid" in t.user_attrs.get("owner", {})]
        if done >= completed and running:
            return running[0]
    raise AssertionError("no trial started in time")


@pytest.mark.slow
def test_killed_controller_resumes_cleanly(tmp_path: Path) -> None:
    search = _search(tmp_path, "--budget", "5m")
    running = _wait_running(tmp_path, completed=1)
    search.send_signal(signal.SIGKILL)
    search.communicate(timeout=10)
    pgid = running.user_attrs["owner"]["pgid"]
    assert group_gone(pgid), f"the trial outlived its killed controller: {in_group(pgid)}"
    assert left_in(tmp_path) == [], "the warm server or a trial outlived its killed controller"

    # The resume is what is checked: one trial, then no confirmation and no parity gate to wait for.
    again = _search(tmp_path, "--budget", "5m", "--n-trials", "1", "--confirm-rounds", "0", "--parity-steps", "0")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-3000:]
    trials = _study(tmp_path).trials
    stale = trials[running.number]
    assert stale.state == TrialState.FAIL and stale.user_attrs["reason"] == "stale"
    assert trials[0].state == TrialState.COMPLETE  # completed work survived
    assert not any(t.state == TrialState.RUNNING for t in trials)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, inherited",
    [(signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_DFL)],
    ids=["SIGINT-inherited-ignored", "SIGTERM"],
)
def test_interrupt_records_exports_and_exits_130(tmp_path: Path, sig: signal.Signals, inherited: Any) -> None:
    search = _search(tmp_path, "--budget", "5m", sigint=inherited)
    running = _wait_running(tmp_path, completed=1)
    t0 = time.monotonic()
    search.send_signal(sig)
    out, err = search.communicate(timeout=60)
    assert search.returncode == 130, err[-3000:]
    assert group_gone(running.user_attrs["owner"]["pgid"], timeout_s=10)
    assert left_in(tmp_path) == []
    assert time.monotonic() - t0 < 30
    trial = _study(tmp_path).trials[running.number]
    assert trial.state == TrialState.FAIL and trial.user_attrs["reason"] == "interrupted"
    assert (tmp_path / "studies" / "autotune" / "best.yaml").exists()
    assert "best config exported" in out


@pytest.mark.slow
def test_concurrent_searches_share_one_journal(tmp_path: Path) -> None:
    # 25 s of 1-second trials: each search runs several trials beside the other's, then both confirm on the one
    # study at once. No parity gate: its extension rounds would run on into the grace after the budget
    # (class checks written by two processes at once: tests/search/store/test_records.py).
    searches = [_search(tmp_path, "--budget", "25s", "--parity-steps", "0", trial_seconds=1) for _ in range(2)]
    outs = [s.communicate(timeout=300) for s in searches]
    for s, (_out, err) in zip(searches, outs):
        assert s.returncode == 0, err[-3000:]
        assert "Traceback" not in err and "lock" not in err.lower()
    trials = _study(tmp_path).get_trials()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers))
    reported = sum(len(re.findall(r"^trial +\d+ \[", out, re.M)) for out, _ in outs)
    assert reported == sum(t.state.is_finished() for t in trials)
    # Left WAITING: only re-measurements of contended trials that the budget had no room for.
    assert all(t.state.is_finished() or t.user_attrs.get("retry_of") is not None for t in trials)
    roles = [t.user_attrs.get("role") for t in trials if t.user_attrs.get("retry_of") is None]
    assert roles.count("baseline") == 1 and roles.count("warm_start") == 1
    assert any(t.user_attrs.get("contended") for t in trials)  # CPU sharing is recorded, not hidden
