"""Telling the study how a trial ended: each way a trial of this process ends reaches a real Optuna study
as that state and value, and no other module calls Study.tell itself."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.core.outcomes import Reason, Role
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord
from autotune.search.store.telling import tell, tell_infeasible

PACKAGE = Path(__file__).resolve().parents[3] / "autotune"


def study() -> optuna.Study:
    return optuna.create_study(direction="maximize")  # in memory


def test_a_value_completes_the_trial_with_it() -> None:
    s = study()
    trial = s.ask()
    told = tell(s, trial, 12.5)
    stored = s.trials[trial.number]
    assert (told.state, told.value) == (stored.state, stored.value) == (TrialState.COMPLETE, 12.5)
    assert told.number == trial.number


def test_zero_is_a_value_not_a_failure() -> None:
    s = study()
    trial = s.ask()
    trial.set_constraint("infeasible", 1.0)  # how an unrun, infeasible trial is told
    told = tell(s, trial, 0.0)
    assert (told.state, told.value) == (TrialState.COMPLETE, 0.0)
    assert s.trials[trial.number].value == 0.0


def test_an_infeasible_config_is_told_with_its_reason_and_constraint() -> None:
    s = study()
    trial = s.ask()
    told = tell_infeasible(s, trial, TrialRecord(role=Role.SEARCH, reason=Reason.MEMORY_ESTIMATE, message="too big"))
    assert (told.state, told.value) == (TrialState.COMPLETE, 0.0)
    assert told.constraints == {FEASIBLE_KEY: 1.0}
    record = TrialRecord.of(told)
    assert (record.reason, record.message) == (Reason.MEMORY_ESTIMATE, "too big")


def test_a_failure_has_no_value() -> None:
    s = study()
    trial = s.ask()
    told = tell(s, trial, state=TrialState.FAIL)
    assert (told.state, told.value) == (s.trials[trial.number].state, None) == (TrialState.FAIL, None)


def test_a_pruned_trial_keeps_its_last_reported_window() -> None:
    s = study()
    trial = s.ask()
    trial.report(3.0, 0)
    trial.report(4.0, 1)
    told = tell(s, trial, state=TrialState.PRUNED)
    assert (told.state, told.value) == (s.trials[trial.number].state, 4.0) == (TrialState.PRUNED, 4.0)


def test_a_value_beside_no_state_completes_the_trial() -> None:
    """The runner passes `state=None` beside a figure: Optuna completes the trial with it."""
    s = study()
    trial = s.ask()
    told = tell(s, trial, 7.0, state=None)
    assert (told.state, told.value) == (TrialState.COMPLETE, 7.0)


def test_only_the_telling_module_calls_study_tell() -> None:
    """One path: a `.tell(` call anywhere else in the package would tell the study around it."""
    calls = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if ".tell(" in line
    ]
    assert [c.rsplit(":", 1)[0] for c in calls] == ["search/store/telling.py"], calls
