"""search/loop/admission.py: the one decision whether a proposal runs. A search proposal that could never
finish in the trial timeout is told infeasible (reason cost_estimate, with its figures), one that only the
budget left is too short for is deferred (a FAIL, never reused), one that fits is launched with its
estimate recorded beside the wall time it took; a config measured before is reused, not run, whether it is
asked of a draw or of a trial, by one identity (True is not 1)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.outcomes import Reason, Role
from autotune.core.settings import SearchSettings
from autotune.search.loop.admission import DEFERRED, FAILED_CLASS, MEASURED, TOO_SLOW
from autotune.search.loop.admission import Admission, Limits, Sizer
from autotune.search.loop.runner import Events, run_one
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import feasible, leaderboard
from autotune.trial.processes import launcher
from tests.search.loop.test_cost import WORK, study_of, timing

BIG = WORK.replace(batch_size=64, precision="bf16")
# The baseline took 20 s: 0.6 s start-up, 3 + 17 steps of 8/9 s, and the rest around them.
AROUND = 20.0 - 0.6 - 20 * 8 / 9
BIG_S = 0.6 + 8 * 64 / 9 + AROUND  # 3 warm-up and 5 timed steps of 64/9 s: about 59 s


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    return study_of(tmp_path, [(Role.BASELINE, {}, timing(8, 9.0), {"wall_s": 20.0})])


def admission(study: optuna.Study, limits: Limits) -> Admission:
    return Admission(study, Sizer(None, print), WORK, limits)


def proposed(study: optuna.Study, cfg: TrialConfig, limits: Limits, role: str = Role.SEARCH) -> tuple[bool, int]:
    decide = admission(study, limits)  # read before the ask, as the session does
    trial = study.ask()
    records.write(trial, TrialRecord(role=role))
    return decide.tell_unrun(trial, cfg, Events()) is not None, trial.number


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
    told, n = proposed(study, WORK, Limits(timeout_s=120.0, given_s=120.0), Role.WARM_START)  # not "measured"
    trial = optuna.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(study._study_id, n))
    frozen = run_one(study, trial, WORK, SearchSettings(budget_s=600, studies_dir=str(tmp_path)), 120, Events())
    r = TrialRecord.from_frozen(frozen)
    assert not told and r.cost_estimate_s == pytest.approx(20.0, abs=0.01)  # the baseline's own config
    assert r.wall_s is not None and 0 <= r.wall_s < 5  # the fake launch returns at once


def test_why_not_says_why_a_config_would_not_be_run(study: optuna.Study) -> None:
    records.write_class_check(study, "precision fp32 -> bf16", {"verdict": "fail", "trial": 0})
    fits = admission(study, Limits(timeout_s=120.0, given_s=120.0)).why_not
    assert fits(WORK) == MEASURED
    assert fits(WORK.replace(precision="bf16")) == FAILED_CLASS
    assert fits(WORK.replace(batch_size=4)) is None
    assert fits(WORK.replace(batch_size=64)) is None  # 59 s fits in 120
    assert admission(study, Limits(timeout_s=120.0, given_s=30.0)).why_not(WORK.replace(batch_size=64)) == DEFERRED
    never = admission(study, Limits(timeout_s=30.0, given_s=30.0))
    assert never.why_not(WORK.replace(batch_size=64)) == TOO_SLOW
    assert never.why_not(WORK.replace(batch_size=64), Role.BASELINE) is None  # the reference always runs
    assert never.why_not(WORK, Role.WARM_START) is None  # held to memory only


def test_a_config_measured_before_is_reused_not_run(study: optuna.Study) -> None:
    """The draw's screen and the asked trial answer alike: the same config is reused, once on the board."""
    decide = admission(study, Limits(timeout_s=120.0, given_s=120.0))
    assert decide.why_not(WORK) == MEASURED and decide.why_not(WORK.replace(batch_size=32)) is None
    trial = study.ask()
    assert decide.tell_unrun(trial, WORK, Events()) == MEASURED
    frozen = study.trials[trial.number]
    assert frozen.value == study.trials[0].value and frozen.user_attrs["repeat_of"] == 0
    assert [t.number for t in leaderboard(study)] == [0]  # shown once, not as a second row


def test_a_pruned_config_is_reused_as_pruned_and_a_running_one_is_not_run_again(study: optuna.Study) -> None:
    pruned, running = study.ask(), study.ask()
    for t, knobs in ((pruned, {"batch_size": 4}), (running, {"batch_size": 16})):
        records.write(t, TrialRecord(role=Role.SEARCH, config=WORK.replace(**knobs).knobs()))
    study.tell(pruned, state=TrialState.PRUNED)
    decide = admission(study, Limits(timeout_s=120.0, given_s=120.0))
    again = study.ask()
    assert decide.tell_unrun(again, WORK.replace(batch_size=4), Events()) == MEASURED
    assert study.trials[again.number].state == TrialState.PRUNED
    twin = study.ask()
    assert decide.tell_unrun(twin, WORK.replace(batch_size=16), Events()) == MEASURED
    told = study.trials[twin.number]
    assert told.state == TrialState.FAIL and told.user_attrs["repeat_of"] == running.number  # no figure yet


def test_one_identity_keeps_a_switch_apart_from_a_count(tmp_path: Path) -> None:
    """True == 1 in Python, but a switch is not a count: a stored config with pin_memory 1 (written by
    something other than a TrialConfig, which refuses it) is not the config with pin_memory true, to the
    draws' screen and to the asked trial alike."""
    study = study_of(tmp_path, [])
    odd = study.ask()
    records.write(odd, TrialRecord(role=Role.SEARCH, config={**WORK.knobs(), "pin_memory": 1}))
    study.tell(odd, 1.0)
    decide = admission(study, Limits(timeout_s=120.0, given_s=120.0))
    switch = WORK.replace(pin_memory=True)
    assert decide.why_not(switch) is None
    trial = study.ask()
    assert decide.tell_unrun(trial, switch, Events()) is None and study.trials[trial.number].state == TrialState.RUNNING
