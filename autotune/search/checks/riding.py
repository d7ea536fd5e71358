"""A class's check rides on its trials: the runs a search makes anyway carry the losses its check compares,
so a verdict costs no process start of its own and no steps beyond the ones it reads.

* The reference: trial 0 and the baseline's second draw already train the baseline's math from its initial
  weights. Trial 0 records each step's loss from step 0; the second draw runs with the data seed + 1, so it
  is the data-order twin (search/loop/draws.py). Where a trial runs fewer steps than the reference needs
  (--parity-steps), both go on, untimed, to them (TrialConfig.record_steps). Their losses are stored as the
  study's parity reference, as a separate reference run would have stored them.
* A class's first trial: a config whose training math (precision, the optimizer step) no check has judged
  yet, against a stored reference that can judge it, starts from the same weights on the same data order
  (every trial does: the study's seed) and records the losses its verdict needs: K steps for parity, the
  time-to-target cap (target.CAP x the reference's samples) for a changed step. It is measured for speed
  like any trial, and is not pruned before its verdict (search/loop/runner.py). Its verdict, judged by
  parity's and target's own comparisons, is the class's, stored once for every worker and a resumed study.
* Left to a check run of its own (search/checks/classes.run_check), said there: a class whose trial could
  not carry it (no stored reference: the second draw did not fit or failed; a resumed study without one; a
  class first met in confirmation; a trial whose class came out other than predicted before it ran).

Which class a config falls in is predicted before it runs from its knobs and whether trial 0's model has
batch-norm layers; the label it is stored under is the one its run recorded (records.of_result), so a wrong
guess costs a few untimed steps and the separate check, never a wrong verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.result import TrialResult
from autotune.core.outcomes import Role
from autotune.core.settings import SearchSettings
from autotune.core.training import changes_step, shown, training_math
from autotune.pipelines import kind_of
from autotune.search.checks import parity, target
from autotune.search.store import records
from autotune.search.store.records import CheckRecord, TrialRecord
from autotune.search.store.results import baseline_sps, baseline_trial, class_label, feasible


def carry(study: optuna.Study, settings: SearchSettings, cfg: TrialConfig, role: str) -> TrialConfig:
    """`cfg` as a trial runs it: with the losses to record when it carries the reference (the baseline) or its
    class's check (the first trial of an unchecked class, against a stored reference that can judge it)."""
    steps = _steps(study, settings, cfg, role)  # a run that has them when its window closes stops there
    return cfg.replace(record_steps=steps) if steps else cfg


def _steps(study: optuna.Study, settings: SearchSettings, cfg: TrialConfig, role: str) -> int:
    k = settings.parity_steps
    if not k or kind_of(settings.base.pipeline).why_not_checkable(settings.base) is not None:
        return 0
    baseline = baseline_of(settings.base)
    if role == Role.BASELINE:
        return k if parity.same_training(cfg, baseline) and stored(study, settings) is None else 0
    ref = stored(study, settings)
    label = _predicted(study, cfg)
    if ref is None or ref.not_checkable or not label or label in records.class_checks(study):
        return 0
    return needed(ref, cfg, baseline, k)


def needed(ref: parity.Reference, cfg: TrialConfig, baseline: TrialConfig, k: int) -> int:
    """The losses, from step 0, that `cfg`'s class verdict reads from its own trial against `ref`: the
    time-to-target cap when its step differs, else K steps of parity; 0 when `ref` cannot judge it so (a
    target too thin to tell, or a reference that does not span the samples parity compares)."""
    if changes_step(cfg):
        return 0 if target.thin(ref) else parity.steps_for(target.CAP * ref.samples, cfg.global_batch_size)
    return parity.candidate_steps(cfg, baseline, k) if parity.covers(ref, cfg, baseline, k) else 0


def _predicted(study: optuna.Study, cfg: TrialConfig) -> str:
    """The class `cfg` will fall in, as far as its knobs and trial 0's model tell ("": the baseline's math)."""
    first = baseline_trial(study)
    batch_norm = first is not None and bool(TrialRecord.from_frozen(first).applied.get("batch_norm_layers"))
    changes = training_math(cfg, batch_norm)
    return shown(changes) if changes else ""


def stored(study: optuna.Study, settings: SearchSettings) -> parity.Reference | None:
    """The study's reference when it is the baseline's and spans --parity-steps; None otherwise."""
    d = records.parity_reference(study)
    ref = parity.Reference.from_dict(d) if d else None
    if ref is None or ref.steps < settings.parity_steps:
        return None
    return ref if parity.same_training(ref.baseline, baseline_of(settings.base)) else None


def twin(
    study: optuna.Study, settings: SearchSettings, cfg: TrialConfig, first: TrialResult | None
) -> TrialConfig | None:
    """The baseline's second draw as the data-order twin (data seed + 1, the same weights), recording the
    reference's steps; None when it carries nothing: no check, a reference stored, or trial 0 (`first`)
    did not record the steps it needs."""
    k = settings.parity_steps
    if first is None or not k or stored(study, settings) is not None or len(first.losses) < k:
        return None
    if kind_of(settings.base.pipeline).why_not_checkable(settings.base) is not None:
        return None
    if not parity.same_training(cfg, baseline_of(settings.base)):
        return None
    order = cfg.seed if cfg.data_seed is None else cfg.data_seed
    return cfg.replace(data_seed=order + 1, record_steps=k)


def store_reference(
    study: optuna.Study, settings: SearchSettings, first: TrialResult, second: TrialResult
) -> parity.Reference | None:
    """The reference from trial 0's losses and its twin's, stored for the study; None when either is short."""
    k = settings.parity_steps
    if len(first.losses) < k or len(second.losses) < k:
        return None
    losses, twin_losses = tuple(first.losses[:k]), tuple(second.losses[:k])
    why = parity.why_not_checkable(first.applied, losses, twin_losses)
    seconds = round(first.record_s + second.record_s, 1)  # their steps past the windows: the reference's cost
    ref = parity.Reference(parity.as_run(baseline_of(settings.base), k), k, losses, twin_losses, seconds, why)
    records.write_parity_reference(study, {**ref.to_dict(), "carried": True})  # by trials: no check paid for it
    return ref


def judge(study: optuna.Study, settings: SearchSettings, frozen: FrozenTrial, run: TrialResult) -> CheckRecord | None:
    """The verdict of `frozen`'s class from the losses its own `run` recorded, stored as the class's check with
    what it cost (the run's steps past its window); None when it carries none (no class, checked already, no
    reference, too few losses)."""
    losses = run.losses
    label = class_label(frozen) if feasible(frozen) else None
    ref = stored(study, settings)
    if not settings.parity_steps or label is None or label in records.class_checks(study) or ref is None:
        return None
    if ref.not_checkable:
        return None  # classes.run_check says why, with no run
    cfg, baseline = TrialRecord.of(frozen).config_for(settings.base), baseline_of(settings.base)
    k = settings.parity_steps
    need = needed(ref, cfg, baseline, k)
    if not need or len(losses) < need:
        return None
    check: CheckRecord
    if changes_step(cfg):
        base = float(baseline_sps(study) or 0.0)
        check = target.judge(losses[:need], cfg.global_batch_size, ref, float(frozen.value or 0.0), base).to_dict()
        check["runs"] = 0
    else:
        check = parity.judge(cfg, baseline, k, losses, ref).to_dict()
    check["trial"], check["seconds"] = frozen.number, round(run.record_s, 1)
    check["reason"] += (
        f" (from trial {frozen.number}'s own run, {run.record_s:.0f} s of steps past its window: no check run of its own)"
    )
    records.write_class_check(study, label, check)
    return check


def why_separate(study: optuna.Study, settings: SearchSettings, t: FrozenTrial, run: TrialResult | None) -> str:
    """Why `t`'s class needs a check run of its own: what kept its trial (`run`, what it recorded) from carrying
    its verdict."""
    ref = stored(study, settings)
    if ref is None:
        why = "trial 0 and the baseline's second draw stored no reference"
        return f"{why} (the draw did not fit, failed, or this study began before checks rode on trials)"
    if ref.not_checkable:
        return f"the reference cannot judge it: {ref.not_checkable}"
    cfg, baseline = TrialRecord.of(t).config_for(settings.base), baseline_of(settings.base)
    need = needed(ref, cfg, baseline, settings.parity_steps)
    if not need and changes_step(cfg):
        return "the baseline's reference is too short to set a target"
    if not need:
        return (
            f"the reference's {ref.samples} samples do not span its check's "
            f"({settings.parity_steps} steps of global batch {cfg.global_batch_size})"
        )
    got = len(run.losses) if run is not None else 0
    return (
        f"trial {t.number} recorded {got} of the {need} losses its verdict needs (they would not fit in the time "
        "a trial had, or its run came out in a class its knobs did not predict)"
    )


def recorded(trial_dir: Path) -> TrialResult | None:
    """What a trial's run recorded (its result.json), or None when it left none readable."""
    try:
        return TrialResult.from_dict(json.loads((trial_dir / "result.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
