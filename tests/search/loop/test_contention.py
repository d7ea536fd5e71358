"""Contention metering: CPU time other processes used while a trial measured. A starved trial is
marked contended, measured once more, and never ranks above a clean figure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Iterator

import optuna
import psutil
import pytest

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import leaderboard
from autotune.search.loop.runner import Events
from autotune.search.loop.session import SearchSession
from autotune.trial.measurement.contention import OtherCpu

BURN = [sys.executable, "-S", "-c", "while True: pass"]  # -S: no site import, so it burns at once


def _burning(procs: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """Wait until every burner has spent CPU: a slow interpreter start (a cold page cache) must not leave
    the window it should starve unstarved."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(psutil.Process(p.pid).cpu_times().user > 0.05 for p in procs):
            return
        time.sleep(0.01)
    raise AssertionError("the burners never started burning")


@pytest.fixture
def burner() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.alone
def test_a_busy_stranger_is_counted_and_our_own_tree_is_not(burner: list[subprocess.Popen[bytes]]) -> None:
    burner.append(subprocess.Popen(BURN))  # a child of this test process: in our tree
    time.sleep(0.2)
    with OtherCpu() as own:
        time.sleep(1.5)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:  # the same burner, seen from a trial whose tree is only the sleeper: a stranger
        with OtherCpu(root_pid=sleeper.pid) as stranger:
            time.sleep(1.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert own.cpus is not None and stranger.cpus is not None
    assert stranger.cpus > 0.7, stranger.cpus  # the burner keeps about one CPU busy
    assert own.cpus < stranger.cpus - 0.5, (own.cpus, stranger.cpus)


@pytest.mark.alone
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to give a neighbour its own")
def test_a_neighbour_on_other_cpus_is_not_contention(burner: list[subprocess.Popen[bytes]]) -> None:
    """One worker per GPU, each pinned to its own CPUs (--cpus): the neighbour's steady use is elsewhere."""
    mine, theirs = sorted(os.sched_getaffinity(0))[:2]
    before = os.sched_getaffinity(0)
    burner.append(subprocess.Popen(["taskset", "-c", str(theirs), *BURN]))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        time.sleep(0.2)
        os.sched_setaffinity(0, {mine})  # the trial's allotment: one CPU, not the burner's
        with OtherCpu(root_pid=sleeper.pid) as pinned:
            time.sleep(1.5)
        os.sched_setaffinity(0, before)  # unpinned: every CPU is the trial's, the burner's too
        with OtherCpu(root_pid=sleeper.pid) as shared:
            time.sleep(1.5)
    finally:
        os.sched_setaffinity(0, before)
        sleeper.kill()
        sleeper.wait()
    assert pinned.cpus is not None and shared.cpus is not None
    # The burner's core is left out of the pinned figure (whatever else runs on the trial's own CPU).
    assert shared.cpus - pinned.cpus > 0.7, (pinned.cpus, shared.cpus)


def test_retries_the_budget_left_waiting_are_said() -> None:
    from autotune.search.loop.session import _say_waiting_retries

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({}, user_attrs=TrialRecord(role="search", retry_of=4).to_attrs())
    said: list[str] = []
    _say_waiting_retries(study, said.append)
    assert len(said) == 1 and "contended trial(s) 4 still wait" in said[0] and "--cpus" in said[0]


def test_too_short_a_window_judges_nothing() -> None:
    with OtherCpu() as m:
        time.sleep(0.05)
    assert m.cpus is None


@pytest.mark.slow
def test_a_starved_trial_is_contended_requeued_and_never_best(
    tmp_path: Path, burner: list[subprocess.Popen[bytes]]
) -> None:
    base = TrialConfig(
        pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, seconds=2.0, window=1, num_threads=1
    )
    settings = SearchSettings(
        budget_s=600,
        n_trials=4,
        storage=str(tmp_path / "studies.db"),
        studies_dir=str(tmp_path / "studies"),
        base=base,
        confirm_rounds=0,
        parity_steps=0,
    )

    def started(number: int, role: str, cfg: TrialConfig) -> None:
        if number == 1:  # starve the warm start: two busy strangers for each CPU (with one each, the
            # kernel's share beside the trial and its loader workers left them as little as 0.1 CPU)
            burner.extend(subprocess.Popen(BURN, start_new_session=True) for _ in range(2 * (os.cpu_count() or 1)))
            _burning(burner)

    def finished(t: optuna.trial.FrozenTrial) -> None:
        while burner:
            p = burner.pop()
            p.kill()
            p.wait()

    session = SearchSession.create(settings, warm=True, say=lambda s: None)  # forked trials: ~5 s less each
    session.run(Events(started=started, finished=finished))
    trials = session.study.trials
    starved = TrialRecord.from_frozen(trials[1])
    assert starved.contended and starved.metrics["others_cpu"] > 0.25, starved.metrics
    retries = [t for t in trials if TrialRecord.from_frozen(t).retry_of == 1]
    assert len(retries) == 1 and dict(TrialRecord.from_frozen(retries[0]).config) == dict(starved.config)
    board = leaderboard(session.study)
    clean = [t.number for t in board if not TrialRecord.from_frozen(t).contended]
    if not clean:  # other processes contended every trial (a busy machine): no clean figure to rank above
        pytest.skip("every trial was contended: the machine is busy, the ranking cannot be checked")
    assert board.index(trials[1]) > max(board.index(t) for t in board if t.number in clean)
