"""How a trial's result is written to the study: `tell`, the one path by which autotune tells Optuna
how a trial of this process ended, whether it ran (search/loop/runner.py) or was told without running
(search/loop/admission.py, search/checks/classes.py).

A config told infeasible without running (`tell_infeasible`: it cannot fit, is too slow here, or its
class failed its check) carries why in its record and the constraint the sampler learns from, like an OOM.
A value completes the trial: its figure, 0.0 for an infeasible one (its constraint set before), or an
earlier trial's figure for the same config. Without a value, the state says how it ended: FAIL (no
figure, never reused) or PRUNED (Optuna keeps its last reported window as its value). Another process's
trial cannot be told; records.fail_other fails it through the storage.

May import: optuna, the rest of search.store.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.search.store import records
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord


def tell(
    study: optuna.Study, trial: optuna.Trial, value: float | None = None, *, state: TrialState | None = None
) -> FrozenTrial:
    """Tell `study` how `trial` ended, as Study.tell takes it (`value`, or `state` without one), and
    return the trial as stored."""
    return study.tell(trial, value, state=state)


def tell_infeasible(study: optuna.Study, trial: optuna.Trial, record: TrialRecord) -> FrozenTrial:
    """Tell a config infeasible without running it: why, in its record; the constraint; 0.0."""
    records.write(trial, record)
    trial.set_constraint(FEASIBLE_KEY, 1.0)
    return tell(study, trial, 0.0)
