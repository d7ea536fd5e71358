"""Reading a study's outcome: which trials count, their order, the baseline, and the best as an Export."""
from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.core.urls import mask_url
from autotune.search.records import StudyRecord, TrialRecord
from autotune.search.storage import DEFAULT_STORAGE


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.value is not None and all(v <= 0 for v in t.constraints.values())


def leaderboard(study: optuna.Study) -> list[FrozenTrial]:
    return sorted((t for t in study.get_trials(deepcopy=False) if feasible(t)), key=lambda t: -float(t.value or 0))


def baseline_sps(study: optuna.Study) -> float | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if TrialRecord.from_frozen(t).role == "baseline" and feasible(t):
            return float(t.value or 0)
    return None


def shown_storage(url: str | None) -> str:
    """The storage as it may be printed: the default journal's path, or the URL with its password masked."""
    return mask_url(url or DEFAULT_STORAGE)


def best_export(study: optuna.Study, storage: str | None, out: Path | None) -> Export:
    """The best feasible trial as an Export; its speedup is the one the study stored with it."""
    board = leaderboard(study)
    if not board:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial to export")
    best = board[0]
    record, study_record = TrialRecord.from_frozen(best), StudyRecord.of(study)
    cfg = TrialConfig.from_dict({**(study_record.workload or {}), **record.config})
    return Export.from_result(
        cfg, record.result(), baseline_samples_per_s=baseline_sps(study), environment=study_record.fingerprint,
        study={"name": study.study_name, "trial": best.number, "storage": shown_storage(storage)},
        reproduce=f"autotune trial --config {out or 'best.yaml'}")
