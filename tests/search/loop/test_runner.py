"""search/loop/runner.py: how run_one tells a trial where it stands matters, not only how it ran (the baseline
and the memory headroom; the near-full device is what this machine lacks, so the launcher's result is
given). A config measured before is reused, not run: tests/search/loop/test_admission.py."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.settings import SearchSettings
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import feasible
from autotune.search.loop.runner import Events, run_one
from autotune.trial.processes import launcher

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
