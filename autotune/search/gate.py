"""The parity gate: before a config is exported as best, it must train like the baseline.

Candidates are taken in export order (the confirmed order by median first, then the rest of the
leaderboard, fastest first). Each is trained side by side with the baseline (search/parity.py); a
candidate that fails is recorded in the study, said, and skipped, and the next one is checked. A
changed global batch whose trajectory failed is not checked again in other candidates (they are
`skipped`): its optimizer step is the difference, and the budget goes to a different one. A check that
does not fit in the budget left is not started (`not checked`) and a cheaper candidate is tried: a
config that passed is exported before one that could not be checked (results.exported). The
baseline's reference trajectory is measured once per study and kept in the study, so a resumed
search or another worker reuses it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import optuna

from autotune.core.config import SearchSettings, baseline_of
from autotune.core.errors import TrialFailure
from autotune.search import confirm, parity
from autotune.search.records import TrialRecord
from autotune.search.results import PARITY, baseline_trial, confirmed_figures, export_order
from autotune.search.runner import end_folder
from autotune.trial.warm import WarmServer

REFERENCE = "parity_reference"  # study user attr: parity.Reference.to_dict()


def run(study: optuna.Study, settings: SearchSettings, *, server: WarmServer | None = None,
        say: Callable[[str], None] = print, deadline: float | None = None) -> dict[str, Any] | None:
    """Check candidates until one passes; returns the verdicts by trial number (also stored in the
    study), or None when parity is off or there is nothing but the baseline to export."""
    steps = settings.parity_steps
    ranked = export_order(study)
    roles = [TrialRecord.from_frozen(t).role for t in ranked]
    # Only what beats the baseline is worth checking: below it, the baseline itself would be exported.
    order = ranked[: roles.index("baseline")] if "baseline" in roles else ranked
    if not steps or not order:
        return None
    verdicts: dict[str, Any] = dict(study.user_attrs.get(PARITY) or {})
    folder = end_folder(settings, study, "parity")
    baseline = baseline_of(settings.base)
    stored = study.user_attrs.get(REFERENCE)
    reference = parity.Reference.from_dict(stored) if stored else None
    if reference is not None and not parity.same_training(reference.baseline, baseline):
        reference = None
    failed_batches: dict[int, int] = {}  # a global batch whose trajectory failed -> the trial that showed it
    say(f"parity: each candidate trains {steps} optimizer steps beside the baseline, from the same weights on the "
        "same data, in fresh processes (--parity-steps 0: off)")
    for t in order:
        key = str(t.number)
        if key in verdicts:  # checked before (a resumed study): its verdict stands
            if verdicts[key]["verdict"] == "pass":
                break
            continue
        cfg = TrialRecord.from_frozen(t).knobs(settings.base)
        failed = failed_batches.get(cfg.global_batch_size)
        if failed is not None:  # the same change of optimizer step already failed: check a different one
            verdicts[key] = {"verdict": "skipped", "reason": f"global batch {baseline.global_batch_size} -> "
                             f"{cfg.global_batch_size} already failed parity (trial {failed})"}
            continue
        need = _cost_s(study, settings, baseline, cfg, reference)
        if confirmed_figures(study, t.number) is None:  # exported, it is confirmed beside the baseline first
            need += confirm.extension_s(study)
        if deadline is not None and time.monotonic() + need > deadline + settings.grace_s:
            say(f"parity: the check of trial {t.number} (about {need:.0f} s) does not fit in the budget left; "
                "a cheaper one is tried")
            verdicts[key] = {"verdict": "not checked", "reason": f"the budget left was shorter than the check "
                             f"(about {need:.0f} s)"}
            continue
        try:
            if reference is None or reference.samples < steps * max(cfg.global_batch_size, baseline.global_batch_size):
                reference = _reference(study, settings, baseline, cfg, folder, server)
            verdict = parity.check(cfg, baseline, steps, folder / f"trial-{t.number}", settings.trial_timeout,
                                   server=server, reference=reference)
        except TrialFailure as e:  # the baseline itself failed to train: nothing can be judged against it
            say(f"parity: the baseline failed to train ({e.reason}); nothing exported is checked")
            verdicts[key] = {"verdict": "not checked", "reason": f"the baseline failed to train: {e.reason}"}
            break
        verdicts[key] = verdict.to_dict()
        study.set_user_attr(PARITY, verdicts)  # each verdict as it comes: an interrupt keeps the ones made
        say(f"parity: trial {t.number} {'passes' if verdict.passed else 'FAILS'}: {verdict.reason} "
            f"({verdict.seconds:.0f} s)" + ("" if verdict.passed else "; the next best is checked instead"))
        if verdict.passed:
            break
        if cfg.global_batch_size != baseline.global_batch_size and verdict.deviation is not None:
            failed_batches[cfg.global_batch_size] = t.number
    study.set_user_attr(PARITY, verdicts)
    return verdicts


def _cost_s(study: optuna.Study, settings: SearchSettings, baseline: Any, cfg: Any,
            reference: parity.Reference | None) -> float:
    """About how long a check of `cfg` takes: its runs of K steps (the baseline's and its twin's too when
    no reference covers it yet) at the baseline's measured step time, plus each run's start-up."""
    measured = baseline_trial(study)
    figures = TrialRecord.from_frozen(measured).metrics if measured is not None else {}
    step, start = float(figures.get("step_time_p50") or 1.0), float(figures.get("startup_s") or 5.0) + 2.0
    ratio = max(1, -(-cfg.global_batch_size // baseline.global_batch_size))
    k = settings.parity_steps
    covered = reference is not None and reference.samples >= k * max(cfg.global_batch_size, baseline.global_batch_size)
    # The candidate's K steps take about ratio x the baseline's step time each; a reference is 2 x K x ratio steps.
    return (k * ratio * step + start) + (0.0 if covered else 2 * (k * ratio * step + start))


def reserve_s(settings: SearchSettings) -> float:
    """Budget to keep for the gate: the reference (2 runs) and one candidate, each about a trial's
    length (K steps of the baseline and start-up), at most a quarter of the budget."""
    if not settings.parity_steps or settings.budget_s is None:
        return 0.0
    return min(3 * ((settings.base.seconds or 15.0) + 15.0), settings.budget_s / 4)


def _reference(study: optuna.Study, settings: SearchSettings, baseline: Any, cfg: Any, folder: Path,
               server: WarmServer | None) -> parity.Reference:
    """The baseline's trajectory and its data-order twin's, long enough for `cfg`'s samples; stored."""
    steps = settings.parity_steps * max(1, -(-cfg.global_batch_size // baseline.global_batch_size))
    reference = parity.noise_reference(baseline, steps, folder / "reference", settings.trial_timeout, server)
    study.set_user_attr(REFERENCE, reference.to_dict())
    return reference
