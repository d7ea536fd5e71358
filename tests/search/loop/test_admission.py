"""search/loop/admission.py: the cost estimate before launch. A search proposal that could never finish in
the trial timeout is told infeasible (reason cost_estimate, with its figures), one that only the budget
left is too short for is deferred (a FAIL, never reused), one that fits is launched with its estimate
recorded beside the wall time it took; `screen` asks the same of a config before it is a trial."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.core.config import TrialConfig, TrialResult
from autotune.core.outcomes import Reason, Role
from autotune.core.settings import SearchSettings
from autotune.search.loop import admission
from autotune.search.loop.admission import Limits, Sizer, cost_writes_off
from autotune.search.loop.runner import Events, run_one
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import feasible
from autotune.trial.processes import launcher
from tests.search.loop.test_cost import WORK, study_of, timing

BIG = WORK.replace(batch_size=64, precision="bf16")
# The baseline took 20 s: 0.6 s start-up, 3 + 17 steps of 8/9 s, and the rest around them.
AROUND = 20.0 - 0.6 - 20 * 8 / 9
BIG_S = 0.6 + 8 * 64 / 9 + AROUND  # 3 warm-up and 5 timed steps of 64/9 s: about 59 s


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    return study_of(tmp_path, [(Role.BASELINE, {}, timing(8, 9.0), {"wall_s": 20.0})])


def proposed(study: optuna.Study, cfg: TrialConfig, limits: Limits, role: str = Role.SEARCH) -> tuple[bool, int]:
    trial = study.ask()
    records.write(trial, TrialRecord(role=role))
    return cost_writes_off(study, trial, cfg, role, limits, Events()), trial.number


def test_a_proposal_that_could_never_fit_the_trial_timeout_is_told_infeasible_with_its_figures(
    study: optuna.Study,
) -> None:
    told, n = proposed(study, BIG, Limits(timeout_s=47.0, given_s=47.0))
    t = study.trials[n]
    r = TrialRecord.from_frozen(t)
    assert told and t.state == TrialState.COMPLETE and not feasible(t) and t.constraints == {"infeasible": 1.0}
    assert r.reason == Reason.COST_ESTIMATE and r.cost_estimate_s == pytest.approx(BIG_S, abs=0.01)
    assert r.message.startswith(f"not run: about {BIG_S:.0f} s to a result, more than the trial timeout (47 s)")
    assert "never finish" in r.message and "7.11 s a step" in r.message
    assert r.wall_s is None  # never launched


def test_a_proposal_only_the_budget_left_is_too_short_for_is_deferred(study: optuna.Study) -> None:
    told, n = proposed(study, BIG, Limits(timeout_s=120.0, given_s=47.0))
    t = study.trials[n]
    r = TrialRecord.from_frozen(t)
    assert told and t.state == TrialState.FAIL  # a FAIL is never reused: a longer run may propose it again
    assert r.reason == Reason.COST_ESTIMATE and r.message.startswith("deferred") and "47 s" in r.message


def test_a_proposal_that_fits_is_launched_and_its_estimate_recorded(study: optuna.Study) -> None:
    told, n = proposed(study, BIG, Limits(timeout_s=120.0, given_s=90.0))
    r = TrialRecord.of(study.trials[n])
    assert (
        not told and study.trials[n].state == TrialState.RUNNING and r.cost_estimate_s == pytest.approx(BIG_S, abs=0.01)
    )
    assert r.reason is None


def test_the_baseline_and_the_warm_start_always_run(study: optuna.Study) -> None:
    for role in (Role.BASELINE, Role.WARM_START):
        told, n = proposed(study, BIG, Limits(timeout_s=10.0, given_s=10.0), role)
        assert not told and TrialRecord.of(study.trials[n]).cost_estimate_s is not None


def test_no_measurement_no_estimate(tmp_path: Path) -> None:
    empty = study_of(tmp_path, [])
    told, n = proposed(empty, BIG, Limits(timeout_s=1.0, given_s=1.0))
    assert not told and TrialRecord.of(empty.trials[n]).cost_estimate_s is None


def test_the_wall_time_is_recorded_beside_the_estimate(
    study: optuna.Study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = TrialResult(status="ok", samples_per_s=9.0, startup_s=0.6, warmup_s=2.7, timed_steps=17)
    monkeypatch.setattr(launcher, "run_trial", lambda cfg, *a, **k: result)
    told, n = proposed(study, WORK, Limits(timeout_s=120.0, given_s=120.0))
    trial = optuna.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(study._study_id, n))
    frozen = run_one(study, trial, WORK, SearchSettings(budget_s=600, studies_dir=str(tmp_path)), 120, Events())
    r = TrialRecord.from_frozen(frozen)
    assert not told and r.cost_estimate_s == pytest.approx(20.0, abs=0.01)  # the baseline's own config
    assert r.wall_s is not None and 0 <= r.wall_s < 5  # the fake launch returns at once


def test_screen_says_why_a_config_would_not_be_run(study: optuna.Study) -> None:
    records.write_class_verdict(study, "precision fp32 -> bf16", {"verdict": "fail", "trial": 0})
    fits = admission.screen(study, Sizer(None, print), WORK, Limits(timeout_s=120.0, given_s=120.0))
    assert fits(WORK) == admission.MEASURED
    assert fits(WORK.replace(precision="bf16")) == admission.FAILED_CLASS
    assert fits(WORK.replace(batch_size=4)) is None
    assert fits(WORK.replace(batch_size=64)) is None  # 59 s fits in 120
    short = admission.screen(study, Sizer(None, print), WORK, Limits(timeout_s=120.0, given_s=30.0))
    assert short(WORK.replace(batch_size=64)) == admission.DEFERRED
    never = admission.screen(study, Sizer(None, print), WORK, Limits(timeout_s=30.0, given_s=30.0))
    assert never(WORK.replace(batch_size=64)) == admission.TOO_SLOW
