"""Reading a study's outcome: which trials count, their order, the baseline, and the best as an Export."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig, baseline_of
from autotune.pipelines.script import OWN_RUN
from autotune.core.configfile import Export
from autotune.core.errors import AutotuneError
from autotune.core.paired import Paired, spread
from autotune.core.training import changes_step, section, shown
from autotune.core.outcomes import Outcome, Reason, Role, Verdict
from autotune.search.store import last_word, records
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


@dataclass(frozen=True)
class BaselineKnobs:
    """The study's baseline config (a trial equal to it runs the job as written) and the knobs it ran: each
    value its measurement showed in effect over the config's (a script's own `-j 2` loader, its batch 12)."""

    config: Mapping[str, Any]
    ran: Mapping[str, Any]


def baseline_knobs(study: optuna.Study) -> BaselineKnobs:
    """What a trial is shown against: what the user runs, not autotune's defaults."""
    knobs = baseline_of(TrialConfig.from_dict(dict(StudyRecord.of(study).workload or {}))).knobs()
    t = baseline_trial(study)
    applied = TrialRecord.from_frozen(t).applied if t is not None else {}
    ran = dict(knobs)
    for k in OWN_RUN:  # not the thread count, whose 0 is torch's default and in effect its count
        effect = applied.get(k) if isinstance(applied, Mapping) else None
        value = effect.get("in_effect") if isinstance(effect, Mapping) else None
        if isinstance(value, (bool, int, float, str)) and type(value) is type(knobs[k]):
            ran[k] = value
    return BaselineKnobs(knobs, ran)


def baseline_figures(study: optuna.Study) -> list[float]:
    """Every draw of the baseline, each its own process: its trials' figures (the clean ones, else all) and
    its further draws (search/loop/draws.py). One draw can be 30% low on a machine whose processes each run
    at their own speed, so no speedup rests on one."""
    runs = [(t, TrialRecord.from_frozen(t)) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    runs = [(t, r) for t, r in runs if r.role == Role.BASELINE and feasible(t)]
    clean = [float(t.value or 0) for t, r in runs if not r.contended] or [float(t.value or 0) for t, _ in runs]
    return clean + (records.baseline_draws(study) if clean else [])


def baseline_sps(study: optuna.Study) -> float | None:
    """The baseline's figure, every speedup's denominator: the median of its draws (baseline_figures)."""
    figures = baseline_figures(study)
    return statistics.median(figures) if figures else None


def baseline_spread(study: optuna.Study) -> tuple[float, float] | None:
    """The baseline's draws as ratios to their median, lowest and highest: this machine's run-to-run noise for
    one config; None with fewer than two draws."""
    figures = baseline_figures(study)
    return spread(figures) if len(figures) >= 2 else None


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
    """How many times fewer samples `t`'s class needs to reach the baseline's target than the baseline does
    (its time-to-target check's samples), else 1: what turns a config's samples/s into the rate at which it
    reaches the baseline's quality. A property of the class, the same for each of its configs, so within a
    class the configs keep the order of their own figures."""
    check = class_check(study, t)
    if not check or check.get("kind") != "time to target":
        return 1.0
    mine, base = check.get("samples_to_target"), check.get("baseline_samples_to_target")
    return float(base) / float(mine) if mine and base else 1.0


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


def confirmed_paired(study: optuna.Study, number: int) -> Paired | None:
    """Trial `number`'s per-round ratios to the baseline in the confirmation, when it was confirmed."""
    summary = records.confirmation(study) or {}
    row = next((r for r in summary.get("rows", []) if r["trial"] == number and r["label"] != "baseline"), None)
    return None if row is None else Paired.of_row(row)


def export_order(study: optuna.Study) -> list[FrozenTrial]:
    """The order in which configs are considered for export: the confirmed ones whose rounds show a
    measurable gain (core/paired.py: at least 3 rounds, a sign-test interval clear of x1.00), by their
    median speedup over the baseline measured beside them, then the rest of the leaderboard, fastest
    first. A confirmed config whose rounds show no measurable gain goes just below the baseline: it is
    neither checked nor exported on its median or its single search figure. A config that changes the
    optimizer step and has a time to target ranks by it (its speedup scaled to the rate at which it
    reaches the target)."""
    board = leaderboard(study)
    summary = records.confirmation(study) or {}
    rows = [r for r in summary.get("rows", []) if r["label"] != "baseline"]
    speedups = {r["trial"]: r["speedup_median"] for r in rows if r.get("speedup_median")}
    gained = {r["trial"] for r in rows if Paired.of_row(r).measurable}
    # Measured in the rounds without a gain; a row the rounds never reached (they did not fit) keeps its
    # place: its search figure is all that is known of it, as of a config the rounds left out.
    below_base = {r["trial"] for r in rows if r["trial"] not in gained and r.get("samples")}
    place = {t.number: i for i, t in enumerate(board)}  # the leaderboard's order (contended last) breaks ties

    def key(t: FrozenTrial) -> tuple[float, int]:
        return -(speedups.get(t.number) or 0.0) * to_target_factor(study, t), place[t.number]

    confirmed = sorted((t for t in board if t.number in gained), key=key)
    rest = [t for t in board if t.number not in gained and t.number not in below_base]
    roles = [TrialRecord.from_frozen(t).role for t in rest]
    at = roles.index(Role.BASELINE) + 1 if Role.BASELINE in roles else len(rest)
    below = sorted((t for t in board if t.number in below_base), key=key)
    return confirmed + rest[:at] + below + rest[at:]


@dataclass(frozen=True)
class Choice:
    """What best.yaml exports, and the configs faster than it that it passed over, each with why."""

    trial: FrozenTrial | None
    passed_over: tuple[dict[str, Any], ...] = ()


def needs_check(study: optuna.Study, t: FrozenTrial, workload: TrialConfig | None = None) -> bool:
    """Whether `t`'s training math differs from the baseline's (precision, global batch, lr, batch-norm
    span), so it is exported only once its check passed; False for a config whose step is the baseline's
    (core/training.SAME_MEANS), and for one whose math is unknown only when it keeps the step."""
    record = TrialRecord.from_frozen(t)
    base = workload or TrialConfig.from_dict(dict(StudyRecord.of(study).workload or {}))
    return bool(record.training_math) or changes_step(record.config_for(base))


def choose(study: optuna.Study, *, gain: bool = True) -> Choice:
    """The export: the first config in export order that may be exported, or the baseline when it comes
    first. A config may be exported when its check did not fail (nor was skipped after a failure of its
    global batch); when its training math differs from the baseline's (precision, global batch, batch-norm
    span), only once its check passed: parity, or its time to target when its optimizer step differs
    (whether the check was off, did not fit in the budget or could not run: the README promises the
    winner is checked before it is exported); once a check passed, a checked config (or one of the
    baseline's own training, which needs none) before an unchecked
    one. When the search was confirmed, a config that changes anything is exported only with a measurable
    gain in its rounds (`gain`=False leaves out that last rule for a config the rounds did not measure:
    the one the end of the search confirms next, finish.confirm_and_gate). The faster configs it passed
    over are named with why, the first of each reason. None: no feasible trial."""
    checks = records.gate_checks(study)
    order = export_order(study)
    base = TrialConfig.from_dict(dict(StudyRecord.of(study).workload or {}))
    confirmed = records.confirmation(study) is not None

    def verdict(t: FrozenTrial) -> str | None:  # its own check's, else its class's
        return (checks.get(str(t.number)) or class_check(study, t) or {}).get("verdict")

    def baseline(t: FrozenTrial) -> bool:
        return TrialRecord.from_frozen(t).role == Role.BASELINE

    def unchecked(t: FrozenTrial) -> str | None:
        """Why `t`'s training math is not known to be the baseline's (None: it is, or its check passed)."""
        math = TrialRecord.from_frozen(t).training_math
        if not needs_check(study, t, base) or verdict(t) == Verdict.PASS:
            return None
        check = checks.get(str(t.number)) or class_check(study, t)
        said = f"it was not checked: {check['reason']}" if check and check.get("reason") else "it was not checked"
        return f"its training math differs ({shown(math) if math else 'optimizer step'}) and {said}"

    def no_gain(t: FrozenTrial) -> str | None:
        """Why the rounds do not show `t` faster than the baseline (None: they do, or were not run)."""
        if not confirmed:
            return None
        rounds = confirmed_paired(study, t.number)
        if rounds is None or not rounds.ratios:
            if not gain:  # the one the end of the search confirms next
                return None
            return "not in the confirmation rounds (they did not fit in the budget): a single measurement"
        return None if rounds.measurable else rounds.statement()

    def why_not(t: FrozenTrial) -> str | None:
        if baseline(t):
            return None
        if verdict(t) in (Verdict.FAIL, Verdict.SKIPPED):
            return "failed"
        return unchecked(t) or no_gain(t)

    ok = [t for t in order if why_not(t) is None]
    if any(check.get("verdict") == Verdict.PASS for check in checks.values()):  # a proven config first
        # A config of the baseline's own training needs no proof: it is never passed over as unchecked.
        proven = [t for t in ok if verdict(t) == Verdict.PASS or baseline(t) or not needs_check(study, t, base)]
        ok = proven or ok
    best = ok[0] if ok else None
    return Choice(best, tuple(_passed_over(study, order, best, why_not)))


def _passed_over(
    study: optuna.Study, order: list[FrozenTrial], best: FrozenTrial | None, why_not: Any
) -> list[dict[str, Any]]:
    """The configs faster than `best` it was chosen over (ahead of it in export order, or confirmed with a
    higher median and no measurable gain), the first for each kind of reason; a failed check is not named:
    the leaderboard says it. With no `best`, every config is ahead: why none may be exported."""
    if best is None:
        floor, ahead = 0.0, order
    else:
        mine = confirmed_paired(study, best.number)
        floor = mine.median if mine and mine.ratios else _search_speedup(study, best) or 1.0
        ahead = order[: order.index(best)]
    out: dict[str, dict[str, Any]] = {}
    for t in ahead + [t for t in order if t not in ahead and t is not best]:
        why, rounds = why_not(t), confirmed_paired(study, t.number)
        if why is None or why == "failed" or TrialRecord.from_frozen(t).role == Role.BASELINE:
            continue
        speed = rounds.median if rounds and rounds.ratios else _search_speedup(study, t)
        if t not in ahead and (speed is None or speed <= floor):
            continue
        kind = "math" if why.startswith("its training math") else "gain"
        out.setdefault(kind, {"trial": t.number, "speedup": speed, "why": why})
    return list(out.values())


def _search_speedup(study: optuna.Study, t: FrozenTrial) -> float | None:
    """`t`'s speedup over the baseline in the search (its one measurement's)."""
    base = baseline_sps(study)
    return TrialRecord.from_frozen(t).speedup or (float(t.value) / base if t.value and base else None)


def final(study: optuna.Study) -> Choice:
    """`choose`, with a script study's alone rounds having the last word: where they could not tell its
    choice from the script as written, the baseline, and the choice named as passed over."""
    choice = choose(study)
    best = last_word.exported(study, choice.trial, baseline_trial(study))
    if choice.trial is None or best is choice.trial:
        return choice
    why = "run alone, the patched script was not measurably faster than the script as written (alone:)"
    # Its figure is the rounds' that overruled it (what the user would get), else confirmation's, else the
    # search's one measurement.
    rounds = confirmed_paired(study, choice.trial.number)
    speedup = (last_word.read(study) or {}).get("median") or (rounds.median if rounds and rounds.ratios else None)
    over = {"trial": choice.trial.number, "speedup": speedup or _search_speedup(study, choice.trial), "why": why}
    return Choice(best, (over, *choice.passed_over))


def exported(study: optuna.Study) -> FrozenTrial | None:
    """The trial best.yaml exports (`final`); None: no feasible trial."""
    return final(study).trial


def confirmed_figures(study: optuna.Study, number: int) -> dict[str, Any] | None:
    """Trial `number`'s figures over the confirmation rounds, when it was confirmed; else None."""
    summary = records.confirmation(study)
    row = next((r for r in (summary or {}).get("rows", []) if r["trial"] == number and r["samples_per_s_median"]), None)
    if row is None or summary is None:
        return None
    keep = ("samples_per_s_median", "min", "max", "speedup_median", "speedup_range")
    # Its own count: a config confirmed after the others (confirm.extend) may have had fewer rounds.
    ratios = list(row.get("ratios") or ()) if row["label"] != "baseline" else []
    paired = Paired.of(ratios)
    return {
        "rounds": len(row["samples"]),
        **{k: row[k] for k in keep},
        # The per-round ratios, the sign test's interval for their median and how often it holds it.
        **({"ratios": ratios, "interval": list(paired.interval), "coverage": paired.coverage} if ratios else {}),
        **({"noise": row["noise"]} if row.get("noise") else {}),
        "baseline_median": summary["baseline_median"],
        "order_changed": summary["order_changed"],
        "search_order": summary["search_order"],
        "confirmed_order": summary["confirmed_order"],
    }


def best_export(study: optuna.Study, storage: str | None, out: Path | None) -> Export:
    """The winner as an Export (`choose`), with the confirmation rounds' median speedup, its range and
    its sign-test interval when it was confirmed, its training math, its check, and the faster configs
    it was chosen over. A script study's alone rounds have the last word (search/store/last_word.py): their
    figure is the speedup, or the export is "no change" when they cannot tell the patched script from the
    script as written."""
    choice = final(study)
    best, passed_over = choice.trial, [dict(p) for p in choice.passed_over]
    if best is None:
        why = "; ".join(f"trial {p['trial']}: {p['why']}" for p in passed_over)
        raise AutotuneError(
            f"study {study.study_name!r} has no trial that may be exported"
            + (
                f" ({why}), and the baseline has not finished a trial: run more trials"
                if why
                else ": no finished feasible trial"
            )
        )
    export = _measured(study, best, storage, out, passed_over)
    rounds = confirmed_figures(study, best.number)
    if rounds is not None:
        export = _confirmed(export, rounds, TrialRecord.from_frozen(best).role == Role.BASELINE)
    return unchanged(last_word.over(study, export))


def unchanged(export: Export) -> Export:
    """`export`, whose speedup is x1 where it is the baseline's own config ("no change"): applying it trains at
    the speed the user has. Its own draw over the draws' median (x0.98, x1.05) is this machine's noise,
    which best.yaml's baseline section says, not a gain or a loss."""
    if not export.config.is_baseline:
        return export
    return dataclasses.replace(export, speedup=1.0)


def _measured(
    study: optuna.Study, best: FrozenTrial, storage: str | None, out: Path | None, passed_over: list[dict[str, Any]]
) -> Export:
    """`best` as its trial measured it, with its training math, its check, the study's checks, its
    ceiling and the configs passed over."""
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
    return dataclasses.replace(
        export,
        training_math=section(cfg, record.training_math),
        parity=records.gate_check(study, best.number) or class_check(study, best),
        checks=checks_summary(study),
        metrics={**export.metrics, **({"memory_estimate": estimate} if estimate else {})},
        baseline_draws=baseline_figures(study),
        ceiling=records.ceiling(study, best.number),
        passed_over=passed_over or None,
    )


def _confirmed(export: Export, rounds: Mapping[str, Any], baseline: bool) -> Export:
    """`export` with its confirmation rounds' figures and their verdict (`baseline`: it is the baseline's,
    "no change", with the first config it was chosen over)."""
    passed_over = export.passed_over or ()
    # Every figure from the same rounds: samples/s is the config's median over them (the search's single
    # measurement stays beside it), the speedup the median of its per-round ratios to the baseline.
    metrics = {
        **export.metrics,
        "samples_per_s": rounds["samples_per_s_median"],
        "search_samples_per_s": export.metrics.get("samples_per_s"),
    }
    if baseline:
        verdict = "no change exported: " + (
            f"trial {passed_over[0]['trial']} was faster, but not measurably or not checked (passed_over)"
            if passed_over
            else "no config was measurably faster than the baseline"
        )
    else:
        verdict = gain_statement(rounds)
    return dataclasses.replace(
        export,
        speedup=rounds["speedup_median"],
        confirmed={**rounds, "verdict": verdict},
        metrics=metrics,
        baseline_samples_per_s=rounds["baseline_median"],
    )


def gain_statement(rounds: Mapping[str, Any]) -> str:
    """What a config's confirmation rounds can say of its speedup (core/paired.py): "faster" only with at
    least 3 rounds and a sign-test interval for the median ratio that excludes x1.00, with the interval
    and its coverage; else no measurable gain, however the median reads."""
    return Paired.of_row(rounds).statement()
