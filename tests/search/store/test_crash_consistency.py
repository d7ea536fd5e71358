"""Nothing lost: `autotune search` killed with SIGKILL at random moments on one study, at least once in
each stretch of its first 11 s (start-up, the warm server, trials and their tells). After each kill the
journal reads, every trial COMPLETE before it is COMPLETE with the same value, the
resume step leaves nothing RUNNING, and no process is left in the folder. Also: a disk that fills
mid-search fails the running trial with the reason, still exports the best, and exits non-zero."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.loop.session import SearchSession
from autotune.search.space.spec import DEFAULT_SPACE
from autotune.search.store.storage import open_storage
from autotune.search.store.liveness import fail_stale
from autotune.trial.processes import launcher
from tests.conftest import REPO_ROOT
from tests.search.loop.test_study_reliability import left_in

# One kill at a random moment in each of KILLS equal stretches (1.3 s each) of 3-11 s after the start:
# start-up (~3 s), the warm server, then a trial and its tell every second or two, the same phases over
# and over after that. Each run completes a few trials, so a few kills meet every phase; more are made,
# 11-15 s after their start, only until one lands mid-trial and five trials are kept (a busy machine
# starts slower, and a kill at 3 s may find no trial done at all).
KILLS = 6
MAX_KILLS = 20
FIRST_S, LAST_S = 3.0, 11.0


def _start(tmp_path: Path) -> subprocess.Popen[bytes]:
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
        "--budget",
        "10m",
        "--pipeline",
        "tests.fault_pipelines:tiny",
        "--image-size",
        "64",
        "--trial-seconds",
        "0.3",
        "--warmup-steps",
        "1",
    ]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _complete(study: optuna.Study) -> dict[int, float]:
    return {t.number: float(t.value) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_random_sigkills_lose_nothing(tmp_path: Path) -> None:
    rng = random.Random(1234)
    width = (LAST_S - FIRST_S) / KILLS
    stretches = rng.sample(range(KILLS), KILLS)  # each stretch once, in a random order
    db = tmp_path / "studies.db"
    before: dict[int, float] = {}
    stale = 0
    kill = 0
    while kill < KILLS or (kill < MAX_KILLS and (stale == 0 or len(before) < 5)):
        search = _start(tmp_path)
        if kill < KILLS:
            time.sleep(FIRST_S + width * (stretches[kill] + rng.random()))
        else:  # the extra kills come late, so that a busy machine's slow start still completes trials
            time.sleep(LAST_S + width * rng.random() * KILLS / 2)
        search.send_signal(signal.SIGKILL)
        search.wait(timeout=10)
        kill += 1
        assert left_in(tmp_path) == [], f"kill {kill}: processes outlived the controller"
        if not db.exists():
            continue  # killed before the study was created
        study = optuna.load_study(study_name="autotune", storage=open_storage(str(db)))  # the journal reads
        now = _complete(study)
        lost = {n: v for n, v in before.items() if now.get(n) != v}
        assert not lost, f"kill {kill}: COMPLETE trials changed or vanished: {lost}"
        # What the next search does when it resumes. The controller is known dead here, so a trial it
        # asked for but had not yet claimed is stale at once (a search waits OWNERLESS_STALE_S for those).
        stale += len(fail_stale(study, ownerless_after_s=0.0))
        study = optuna.load_study(study_name="autotune", storage=open_storage(str(db)))
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        assert not running, f"kill {kill}: left RUNNING: {[(t.number, t.user_attrs) for t in running]}"
        before = now
    assert len(before) >= 5, f"only {len(before)} trials completed over {kill} kills: the test exercised too little"
    repaired = len(list(tmp_path.glob("studies.db.torn-*")))
    print(
        f"\n{kill} kills: {len(before)} complete trials kept with their values, {stale} trial(s) killed "
        f"mid-run marked stale, {repaired} torn tail(s) repaired"
    )


@pytest.mark.slow
def test_disk_full_mid_search_fails_the_trial_and_still_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = launcher.run_trial
    calls = [0]

    def fills_up(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 3:  # after trial 0 and the baseline's second draw: the second trial starts writing its files
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "studies" / "trial-1" / "trial.log"))
        return real(*args, **kw)

    monkeypatch.setattr(launcher, "run_trial", fills_up)
    settings = SearchSettings(
        budget_s=300,
        n_trials=4,
        storage=str(tmp_path / "studies.db"),
        space=str(DEFAULT_SPACE),
        studies_dir=str(tmp_path / "studies"),
        base=TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1),
    )
    outcome = SearchSession.create(settings, warm=False, say=lambda s: None).run()
    assert outcome.error and "No space left on device" in outcome.error
    assert outcome.trials == 1 and outcome.best_yaml is not None and outcome.best_yaml.is_file()
    study = optuna.load_study(study_name="autotune", storage=open_storage(settings.storage))
    failed = study.trials[1]
    assert failed.state == TrialState.FAIL and failed.user_attrs["reason"] == "disk"
