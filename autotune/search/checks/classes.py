"""One check per training-math class, as soon as it matters, and a failed class never run again.

A class is the set of configs with the same training math (core/training.py), for example
`global batch 8 -> 32; lr 0.001 -> 0.002 (sqrt rule)` or `precision fp32 -> bf16`. Configs that compute
the baseline's own training form no class and need no class check. The first time a class enters the
top k of the leaderboard (k = --confirm-top) and beats the baseline, it is checked right away, if the
check fits in the budget: parity (search/checks/parity.py) for a class that keeps the optimizer step, time to
target (search/checks/target.py) for one that changes it. The check is stored per class in the study, so
workers, a resumed search and the end-of-search gate reuse it; a passed class is not checked again.

A config the sampler proposes in a failed class is not run: its trial is told infeasible at once (an
Optuna constraint, with the reason), so TPE learns the region is infeasible and the budget goes
elsewhere. Optuna cannot add a constraint to a trial that already finished, so the class's earlier
trials stay as measured, and the gate and the export skip them by their class's check.
"""

from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.settings import SearchSettings
from autotune.core.outcomes import Reason, Role, Verdict
from autotune.core.training import changes_step
from autotune.pipelines import kind_of
from autotune.search.checks import parity, riding, target
from autotune.search.store import records
from autotune.search.budget import Budget
from autotune.search.store.folders import trial_dir
from autotune.search.store.records import CheckRecord, TrialRecord
from autotune.search.store.results import (
    baseline_sps,
    baseline_trial,
    class_label,
    confirmed_figures,
    feasible,
    leaderboard,
)
from autotune.search.store.telling import tell_infeasible
from autotune.trial.processes.warm_client import WarmServer


def write_off(
    study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, label: str, check: CheckRecord
) -> FrozenTrial:
    """Tell a proposal in a failed class infeasible without running it."""
    return tell_infeasible(
        study,
        trial,
        TrialRecord(
            role=Role.SEARCH,
            config=cfg.knobs(),
            reason=Reason.CLASS_FAILED,
            message=f"not run: its training math ({label}) failed its check at trial "
            f"{check.get('trial')}: {check.get('reason', '')}"[:500],
        ),
    )


def reference(
    study: optuna.Study, settings: SearchSettings, folder: Path, server: WarmServer | None
) -> parity.Reference:
    """The baseline's K-step trajectory and its data-order twin's: stored once per study, reused."""
    baseline = baseline_of(settings.base)
    stored = records.parity_reference(study)
    ref = parity.Reference.from_dict(stored) if stored else None
    if ref is not None and parity.same_training(ref.baseline, baseline) and ref.steps >= settings.parity_steps:
        return ref
    ref = parity.noise_reference(baseline, settings.parity_steps, folder / "reference", settings.trial_timeout, server)
    records.write_parity_reference(study, ref.to_dict())
    return ref


def speeds(study: optuna.Study, t: FrozenTrial) -> tuple[float, float]:
    """(the candidate's samples/s, the baseline's), from the confirmation rounds when they measured both:
    the baseline's median and the candidate's at the median of its per-round ratios to it."""
    rounds = confirmed_figures(study, t.number)
    if rounds is not None:
        base = float(rounds["baseline_median"])
        return float(rounds["speedup_median"]) * base, base
    return float(t.value or 0), float(baseline_sps(study) or 0)


def run_check(
    study: optuna.Study,
    settings: SearchSettings,
    t: FrozenTrial,
    cfg: TrialConfig,
    folder: Path,
    server: WarmServer | None,
) -> CheckRecord:
    """Check `t`'s class (parity, or time to target when its step differs); stored per class and returned.
    Raises the baseline's TrialFailure when the baseline itself cannot train."""
    t0 = time.monotonic()
    why = kind_of(settings.base.pipeline).why_not_checkable(settings.base)
    if why is not None:  # never a pass: the check would compare two unrelated runs
        kind = "time to target" if changes_step(cfg) else "parity"
        check: CheckRecord = {"kind": kind, "verdict": Verdict.NOT_CHECKED, "reason": f"not checkable: {why}"}
    elif (ref := reference(study, settings, folder, server)).not_checkable:  # never a pass at a floor
        kind = "time to target" if changes_step(cfg) else "parity"
        check = {"kind": kind, "verdict": Verdict.NOT_CHECKED, "reason": f"not checkable: {ref.not_checkable}"}
    elif changes_step(cfg):
        mine, base = speeds(study, t)
        check = target.check(
            cfg, ref, folder / f"trial-{t.number}", settings.trial_timeout, mine, base, server
        ).to_dict()
    else:
        check = parity.check(
            cfg,
            baseline_of(settings.base),
            settings.parity_steps,
            folder / f"trial-{t.number}",
            settings.trial_timeout,
            server=server,
            reference=ref,
        ).to_dict()
    check["trial"], check["seconds"] = t.number, round(time.monotonic() - t0, 1)
    label = class_label(t)
    if label is not None:
        records.write_class_check(study, label, check)
    return check


def cost_s(study: optuna.Study, settings: SearchSettings, t: FrozenTrial, cfg: TrialConfig) -> float:
    """About how long run_check takes: the reference's 2 runs when none is stored, and the candidate's
    run at its measured samples/s, each with a trial's start-up."""
    base = baseline_trial(study)
    figures = TrialRecord.from_frozen(base).metrics if base is not None else {}
    step, start = float(figures.get("step_time_p50") or 1.0), float(figures.get("startup_s") or 5.0) + 2.0
    k, g_b = settings.parity_steps, baseline_of(cfg).global_batch_size
    need = 0.0 if records.parity_reference(study) else 2 * (k * step + start)
    samples = target.cost_samples(cfg, k * g_b) if changes_step(cfg) else k * g_b
    return need + samples / max(float(t.value or 0), 1e-9) + start


def separate_why(study: optuna.Study, settings: SearchSettings, t: FrozenTrial) -> str:
    """Why `t`'s class is checked by a run of its own rather than by its trial (riding.why_separate)."""
    return riding.why_separate(study, settings, t, riding.recorded(trial_dir(settings, t.number)))


def check_if_it_matters(
    study: optuna.Study,
    settings: SearchSettings,
    frozen: FrozenTrial,
    folder: Path,
    server: WarmServer | None,
    say: Callable[[str], None],
    budget: Budget | None,
) -> None:
    """After a trial: if its class just entered the top k, beats the baseline and is unchecked, check it
    now, when the check ends before the trial loop's deadline."""
    label = class_label(frozen) if feasible(frozen) else None
    if not settings.parity_steps or label is None or label in records.class_checks(study):
        return
    top = leaderboard(study)[: max(1, settings.confirm_top)]
    base = baseline_sps(study)
    if frozen.number not in {t.number for t in top} or not base or float(frozen.value or 0) <= base:
        return
    cfg = TrialRecord.of(frozen).config_for(settings.base)
    need = cost_s(study, settings, frozen, cfg)
    if not Budget.fits(need, budget.search_deadline if budget else None):
        return  # the end-of-search gate checks it if it still leads and the budget allows
    kind = "time to target" if changes_step(cfg) else "parity"
    say(
        f"check: trial {frozen.number}'s training math ({label}) entered the top {len(top)}: {kind} check now, "
        f"a run of its own (about {need:.0f} s): {separate_why(study, settings, frozen)}"
    )
    try:
        check = run_check(study, settings, frozen, cfg, folder, server)
    except Exception as e:  # noqa: BLE001 - the baseline failed to train: nothing can be judged, the search goes on
        say(f"check: not made: {getattr(e, 'reason', type(e).__name__)}: {str(e)[:200]}")
        return
    words: dict[str, str] = {Verdict.PASS: "passes", Verdict.FAIL: "FAILS"}
    said = words.get(check["verdict"], Verdict.NOT_CHECKED)
    say(
        f"check: {label}: {said}: {check['reason']} ({check['seconds']:.0f} s)"
        + ("; its configs are not run again" if check["verdict"] == Verdict.FAIL else "")
    )
