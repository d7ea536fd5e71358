"""Reading a study's outcome: which trials count, their order, the baseline, and the best as an Export."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.core.training import changes_step, section, shown
from autotune.core.outcomes import Outcome, Reason, Role, Verdict
from autotune.search.store import alone, records
from autotune.search.space.memory import versus_peak
from autotune.search.store.storage import shown_storage
from autotune.search.store.records import CheckRecord, StudyRecord, TrialRecord


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.value is not None and all(v <= 0 for v in t.constraints.values())


def rank(t: FrozenTrial) -> tuple[bool, float, int]:
    """The one order of measured trials, lowest first: every contended figure below every clean one (a
    measurement another process starved is never the best while a clean one exists), then the fastest,
    then the earliest. The leaderboard, the strategy's incumbent and confirmation's candidates use it."""
    return records.contended(t), -float(t.value or 0.0), t.number


def leaderboard(study: optuna.Study) -> list[FrozenTrial]:
    """The trials whose own figure ranks (records.outcome), in `rank` order: a config the sampler proposed
    again (reused, not re-run) appears once."""
    return sorted((t for t in study.get_trials(deepcopy=False) if records.outcome(t).ranks), key=rank)


def baseline_trial(study: optuna.Study) -> FrozenTrial | None:
    """The baseline's measurement: its first clean one, else its first (contended) one."""
    runs = [(t, TrialRecord.from_frozen(t)) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    runs = [(t, r) for t, r in runs if r.role == Role.BASELINE and feasible(t)]
    clean = [t for t, r in runs if not r.contended] or [t for t, _ in runs]
    return clean[0] if clean else None


def baseline_sps(study: optuna.Study) -> float | None:
    """The baseline's figure (baseline_trial's)."""
    t = baseline_trial(study)
    return float(t.value or 0) if t is not None else None


def class_label(t: FrozenTrial) -> str | None:
    """A measured trial's training-math class, or None when it computes the baseline's training."""
    math = TrialRecord.from_frozen(t).training_math
    return shown(math) if math else None


def failed_classes(study: optuna.Study) -> set[str]:
    """The training-math classes whose check failed."""
    return {k for k, check in records.class_checks(study).items() if check.get("verdict") == Verdict.FAIL}


def class_check(study: optuna.Study, t: FrozenTrial) -> CheckRecord | None:
    """The check of `t`'s class, when its class was checked."""
    label = class_label(t)
    return records.class_checks(study).get(label) if label else None


def to_target_factor(study: optuna.Study, t: FrozenTrial) -> float:
    """speedup to target / samples/s speedup for a config whose time to target was measured, else 1: what
    turns its samples/s into the rate at which it reaches the baseline's quality."""
    check = class_check(study, t)
    speedup = TrialRecord.from_frozen(t).speedup
    to_target = check.get("speedup_to_target") if check else None
    if not check or check.get("kind") != "time to target" or not to_target or not speedup:
        return 1.0
    return float(to_target) / speedup


def checks_summary(study: optuna.Study) -> dict[str, Any] | None:
    """The classes checked (each once), the trials run in classes that failed (before their check) and
    the share of trial time they took, the proposals written off unrun after it, and the time spent
    checking; None when no class was checked."""
    checks = records.class_checks(study)
    if not checks:
        return None
    failed = failed_classes(study)
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    written_off = [
        t
        for t in trials
        if records.outcome(t) == Outcome.WRITTEN_OFF and TrialRecord.from_frozen(t).reason == Reason.CLASS_FAILED
    ]
    run = [t for t in trials if t not in written_off]
    spent = [t for t in run if class_label(t) in failed]
    seconds = {t.number: t.duration.total_seconds() if t.duration else 0.0 for t in run}
    total = sum(seconds.values())
    return {
        "classes": {
            label: {
                key: check.get(key)
                for key in ("kind", "verdict", "trial", "speedup_to_target", "reason")
                if check.get(key) is not None
            }
            for label, check in checks.items()
        },
        "trials_in_failed_classes": len(spent),
        "trials": len(run),
        "share_of_trial_time_in_failed_classes": round(sum(seconds[t.number] for t in spent) / total, 3)
        if total
        else 0.0,
        "written_off": len(written_off),
        "check_seconds": round(sum(float(check.get("seconds") or 0) for check in checks.values()), 1),
    }


def export_order(study: optuna.Study) -> list[FrozenTrial]:
    """The order in which configs are considered for export: the confirmed ones by their median speedup
    over the baseline measured beside them, then the rest of the leaderboard, fastest first. A confirmed
    config whose median speedup is not above 1 goes just below the baseline: it is neither checked nor
    exported on its single search figure. A config that changes the optimizer step and has a time to
    target ranks by it (its speedup scaled to the rate at which it reaches the target)."""
    board = leaderboard(study)
    summary = records.confirmation(study) or {}
    speedups = {
        r["trial"]: r["speedup_median"]
        for r in summary.get("rows", [])
        if r["label"] != "baseline" and r.get("speedup_median")
    }
    slower = {n for n, x in speedups.items() if x <= 1.0}
    place = {t.number: i for i, t in enumerate(board)}  # the leaderboard's order (contended last) breaks ties

    def key(t: FrozenTrial) -> tuple[float, int]:
        return -speedups[t.number] * to_target_factor(study, t), place[t.number]

    confirmed = sorted((t for t in board if t.number in speedups and t.number not in slower), key=key)
    rest = [t for t in board if t.number not in speedups]
    roles = [TrialRecord.from_frozen(t).role for t in rest]
    at = roles.index(Role.BASELINE) + 1 if Role.BASELINE in roles else len(rest)
    below = sorted((t for t in board if t.number in slower), key=key)
    return confirmed + rest[:at] + below + rest[at:]


def exported(study: optuna.Study) -> FrozenTrial | None:
    """The trial best.yaml exports: the first in export order that passed parity, or the baseline if it
    comes first. When nothing passed (parity off, or no check fitted in the budget): the first whose
    check did not fail (nor was skipped after a failure of its global batch), except that with the checks
    on, a config that changes the optimizer step is exported only once its time to target passed: its
    samples/s says nothing of how soon it reaches the baseline's quality (a larger batch can run faster
    and still reach the target later). None: no feasible trial."""
    checks = records.gate_checks(study)
    order = export_order(study)
    workload = StudyRecord.of(study).workload or {}

    def verdict(t: FrozenTrial) -> str | None:  # its own check's, else its class's
        return (checks.get(str(t.number)) or class_check(study, t) or {}).get("verdict")

    def unproven_step(t: FrozenTrial) -> bool:
        cfg = TrialConfig.from_dict({**workload, **TrialRecord.from_frozen(t).config})
        return bool(checks) and verdict(t) != Verdict.PASS and changes_step(cfg)

    if any(
        check.get("verdict") == Verdict.PASS for check in checks.values()
    ):  # a proven config before an unchecked one
        proven = [t for t in order if verdict(t) == Verdict.PASS or TrialRecord.from_frozen(t).role == Role.BASELINE]
        if proven:
            return proven[0]
    ok = [t for t in order if verdict(t) not in (Verdict.FAIL, Verdict.SKIPPED) and not unproven_step(t)]
    return ok[0] if ok else None


def confirmed_figures(study: optuna.Study, number: int) -> dict[str, Any] | None:
    """Trial `number`'s figures over the confirmation rounds, when it was confirmed; else None."""
    summary = records.confirmation(study)
    row = next((r for r in (summary or {}).get("rows", []) if r["trial"] == number and r["samples_per_s_median"]), None)
    if row is None or summary is None:
        return None
    keep = ("samples_per_s_median", "min", "max", "speedup_median", "speedup_range")
    # Its own count: a config confirmed after the others (confirm.extend) may have had fewer rounds.
    return {
        "rounds": len(row["samples"]),
        **{k: row[k] for k in keep},
        "baseline_median": summary["baseline_median"],
        "order_changed": summary["order_changed"],
        "search_order": summary["search_order"],
        "confirmed_order": summary["confirmed_order"],
    }


def best_export(study: optuna.Study, storage: str | None, out: Path | None) -> Export:
    """The winner as an Export: the first config in export order that passed parity (or was not
    checked), with the confirmation rounds' median speedup and its range when it was confirmed, its
    training math, and its parity check. A script study's alone rounds have the last word
    (search/store/alone.py): their figure is the speedup, or the export is "no change" when they cannot
    tell the patched script from the script as written."""
    best = alone.exported(study, exported(study), baseline_trial(study))
    if best is None:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial to export")
    rounds = confirmed_figures(study, best.number)
    record, study_record = TrialRecord.from_frozen(best), StudyRecord.of(study)
    cfg = TrialConfig.from_dict({**(study_record.workload or {}), **record.config})
    export = Export.from_result(
        cfg,
        record.result(),
        baseline_samples_per_s=baseline_sps(study),
        environment=study_record.fingerprint,
        study={"name": study.study_name, "trial": best.number, "storage": shown_storage(storage)},
        reproduce=f"autotune trial --config {out or 'best.yaml'}",
    )
    # The estimate made before launch beside the peak it measured, so the estimate's error is in view.
    estimate = versus_peak(record.memory_estimate, record.metrics.get("peak_memory_bytes"))
    export = dataclasses.replace(
        export,
        training_math=section(cfg, record.training_math),
        parity=records.gate_check(study, best.number) or class_check(study, best),
        checks=checks_summary(study),
        metrics={**export.metrics, **({"memory_estimate": estimate} if estimate else {})},
        ceiling=records.ceiling(study, best.number),
    )
    if rounds is None:
        return alone.over(study, export)
    # Every figure from the same rounds: samples/s is the config's median over them (the search's single
    # measurement stays beside it), the speedup the median of its per-round ratios to the baseline.
    metrics = {
        **export.metrics,
        "samples_per_s": rounds["samples_per_s_median"],
        "search_samples_per_s": export.metrics.get("samples_per_s"),
    }
    confirmed = dataclasses.replace(
        export,
        speedup=rounds["speedup_median"],
        confirmed={**rounds, "verdict": gain_statement(rounds)},
        metrics=metrics,
        baseline_samples_per_s=rounds["baseline_median"],
    )
    return alone.over(study, confirmed)


def gain_statement(rounds: Mapping[str, Any]) -> str:
    """What the confirmation rounds can say of a speedup: a median with a range that holds x1.00 is no
    measured gain, however the median reads, and one round is a single draw on a machine whose speed
    moves from process to process."""
    low, high = rounds["speedup_range"]
    if rounds["rounds"] < 2:
        return f"one round: a single draw (x{low:.2f}), not yet a measured gain"
    if low <= 1.0 <= high:
        return f"no measurable gain over the baseline on this machine (the rounds read x{low:.2f}..x{high:.2f})"
    return f"{'faster' if low > 1.0 else 'slower'} than the baseline in every round (x{low:.2f}..x{high:.2f})"
