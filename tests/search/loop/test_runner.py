"""search/loop/runner.py: run_one's verdicts that depend on where a trial stands, not on how it ran (the baseline and the
memory headroom; the near-full device is what this machine lacks, so the launcher's result is given), and a
config measured before reused, not run."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.core.config import TrialConfig, TrialResult
from autotune.core.settings import SearchSettings
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import feasible, leaderboard
from autotune.search.loop.runner import Events, measured, reuse, run_one
from autotune.trial.processes import launcher
from tests.search.store.test_results import TINY, study_with

GIB = 2**30


def near_full(sps: float) -> TrialResult:
    """A run that peaked at 95% of its device: 5% free, under the default 10% headroom."""
    return TrialResult(
        status="ok",
        samples_per_s=sps,
        peak_memory_bytes=int(0.95 * 80 * GIB),
        memory_total_bytes=80 * GIB,
        device="cuda:0",
    )


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    figures: list[float] = []
    monkeypatch.setattr(launcher, "run_trial", lambda cfg, *a, **k: near_full(figures.pop(0)))
    return figures


def test_a_baseline_over_the_headroom_is_kept_and_said(tmp_path: Path, launched: list[float]) -> None:
    settings = SearchSettings(budget_s=60, studies_dir=str(tmp_path))
    study = optuna.create_study(direction="maximize")
    launched += [10.0, 20.0]
    for role in ("baseline", "search"):
        trial = study.ask()
        trial.set_user_attr("role", role)
        run_one(study, trial, TrialConfig(), settings, 60, Events())
    base, other = study.trials
    assert feasible(base) and base.value == 10.0  # the reference: measured and reported
    assert "baseline breaks the headroom" in TrialRecord.from_frozen(base).message
    assert not feasible(other) and other.value == 0.0  # any other config over it: infeasible, never exported
    assert TrialRecord.from_frozen(other).reason == "headroom"


def test_a_config_measured_before_is_reused_not_run(tmp_path: Path) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"batch_size": 4}, 30.0)])
    again = TINY.replace(batch_size=4)
    earlier = measured(study, again)
    assert earlier is not None and earlier.number == 1 and measured(study, TINY.replace(batch_size=32)) is None
    frozen = reuse(study, study.ask(), earlier)
    assert frozen.value == 30.0 and frozen.user_attrs["repeat_of"] == 1 and frozen.constraints == {"infeasible": 0.0}
    assert [t.number for t in leaderboard(study)] == [1, 0]  # shown once, not as a second row
