"""Every use of Optuna's private API, in one place. We run ask/tell ourselves (a trial is a process we
launch and classify, not a Python callable), so we need three things `Study.optimize` does internally:
the RDB heartbeat thread, a trial's storage id, and the study's storage. `SUPPORTED` is the range of
Optuna versions this was checked against; tests/search/store/test_optuna_private.py pins it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread, is_heartbeat_enabled  # what Study.optimize uses
from optuna.trial import FrozenTrial, TrialState

SUPPORTED = ((5, 0), (6, 0))  # [low, high): the Optuna versions these private names were checked against


def storage_of(study: optuna.Study) -> Any:
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    return trial._trial_id


def heartbeats(study: optuna.Study) -> bool:
    """True for storages with RDB heartbeats: a dead worker's trial is failed by optuna itself."""
    return bool(is_heartbeat_enabled(study._storage))


def heartbeat_thread(study: optuna.Study, trial: optuna.Trial) -> AbstractContextManager[Any]:
    """The heartbeat thread Study.optimize runs around a trial, so other workers see it alive
    (a no-op context for storages without heartbeats)."""
    return get_heartbeat_thread(trial._trial_id, study._storage)  # type: ignore[return-value]  # BaseHeartbeatThread is a context manager


def fail_trial(study: optuna.Study, trial: FrozenTrial, attrs: dict[str, Any]) -> None:
    """Mark another process's RUNNING trial FAIL with these attrs (Study.tell only takes our own trials)."""
    storage = study._storage
    for key, value in attrs.items():
        storage.set_trial_user_attr(trial._trial_id, key, value)
    storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
