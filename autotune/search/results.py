"""Reading a study's outcome: which trials count, their order, the baseline, and the best as an Export."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.core.training import section
from autotune.core.urls import mask_url
from autotune.search.records import StudyRecord, TrialRecord
from autotune.search.storage import DEFAULT_STORAGE


CONFIRMATION = "confirmation"  # the study user attr holding the last confirmation (search/confirm.py)
# Study user attr: trial number (str) -> its parity verdict (search/parity.py). A study attr, because a
# finished trial's own attrs can no longer be written.
PARITY = "parity"


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.value is not None and all(v <= 0 for v in t.constraints.values())


def leaderboard(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible trials, fastest first, every contended figure below every clean one (a measurement
    another process starved is never the best while a clean one exists); a config the sampler
    proposed again (reused, not re-run) appears once."""
    rows = [(t, TrialRecord.from_frozen(t)) for t in study.get_trials(deepcopy=False) if feasible(t)]
    return [t for t, r in sorted(((t, r) for t, r in rows if r.repeat_of is None),
                                 key=lambda tr: (tr[1].contended, -float(tr[0].value or 0)))]


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The baseline's measurement: its first clean one, else its first (contended) one."""
    runs = [(t, TrialRecord.from_frozen(t)) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    runs = [(t, r) for t, r in runs if r.role == "baseline" and feasible(t)]
    clean = [t for t, r in runs if not r.contended] or [t for t, _ in runs]
    return clean[0] if clean else None


def baseline_sps(study: optuna.Study) -> float | None:
    """The baseline's figure (baseline_trial's)."""
    t = baseline_trial(study)
    return float(t.value or 0) if t is not None else None


def shown_storage(url: str | None) -> str:
    """The storage as it may be printed: the default journal's path, or the URL with its password masked."""
    return mask_url(url or DEFAULT_STORAGE)


def export_order(study: optuna.Study) -> list[FrozenTrial]:
    """The order in which configs are considered for export: the confirmed ones by their median, then
    the rest of the leaderboard, fastest first."""
    board = leaderboard(study)
    summary = study.user_attrs.get(CONFIRMATION) or {}
    by_number = {t.number: t for t in board}
    confirmed = [r["trial"] for r in sorted((r for r in summary.get("rows", []) if r.get("samples_per_s_median")
                                             and r["label"] != "baseline"), key=lambda r: -r["samples_per_s_median"])]
    first = [by_number[n] for n in confirmed if n in by_number]
    return first + [t for t in board if t.number not in confirmed]


def exported(study: optuna.Study) -> FrozenTrial | None:
    """The trial best.yaml exports: the first in export order that passed parity, or the baseline if it
    comes first. When nothing passed (parity off, or no check fitted in the budget): the first whose
    check did not fail (nor was skipped after a failure of its global batch). None: no feasible trial."""
    verdicts = study.user_attrs.get(PARITY) or {}
    order = export_order(study)

    def verdict(t: FrozenTrial) -> str | None:
        return (verdicts.get(str(t.number)) or {}).get("verdict")

    if any(v.get("verdict") == "pass" for v in verdicts.values()):  # a proven config before an unchecked one
        proven = [t for t in order if verdict(t) == "pass" or TrialRecord.from_frozen(t).role == "baseline"]
        if proven:
            return proven[0]
    ok = [t for t in order if verdict(t) not in ("fail", "skipped")]
    return ok[0] if ok else None


def confirmed_figures(study: optuna.Study, number: int) -> dict[str, Any] | None:
    """Trial `number`'s figures over the confirmation rounds, when it was confirmed; else None."""
    summary = study.user_attrs.get(CONFIRMATION)
    row = next((r for r in (summary or {}).get("rows", []) if r["trial"] == number and r["samples_per_s_median"]),
               None)
    if row is None:
        return None
    keep = ("samples_per_s_median", "min", "max", "speedup_median", "speedup_range")
    # Its own count: a config confirmed after the others (confirm.extend) may have had fewer rounds.
    return {"rounds": len(row["samples"]), **{k: row[k] for k in keep},
            "baseline_median": summary["baseline_median"], "order_changed": summary["order_changed"],
            "search_order": summary["search_order"], "confirmed_order": summary["confirmed_order"]}


def best_export(study: optuna.Study, storage: str | None, out: Path | None) -> Export:
    """The winner as an Export: the first config in export order that passed parity (or was not
    checked), with the confirmation rounds' median speedup and its range when it was confirmed, its
    training math, and its parity verdict."""
    best = exported(study)
    if best is None:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial to export")
    rounds = confirmed_figures(study, best.number)
    record, study_record = TrialRecord.from_frozen(best), StudyRecord.of(study)
    cfg = TrialConfig.from_dict({**(study_record.workload or {}), **record.config})
    export = Export.from_result(
        cfg, record.result(), baseline_samples_per_s=baseline_sps(study), environment=study_record.fingerprint,
        study={"name": study.study_name, "trial": best.number, "storage": shown_storage(storage)},
        reproduce=f"autotune trial --config {out or 'best.yaml'}")
    export = dataclasses.replace(export, training_math=section(cfg, record.training_math),
                                 parity=(study.user_attrs.get(PARITY) or {}).get(str(best.number)))
    if rounds is None:
        return export
    return dataclasses.replace(export, speedup=rounds["speedup_median"], confirmed=rounds,
                               baseline_samples_per_s=rounds["baseline_median"])
