"""Admission: what a proposal must pass before it is launched. Its memory estimate and its cost estimate
(search/loop/cost.py) are recorded beside it. A config that cannot fit in memory, or could never finish in
the trial timeout, is written off unrun (an infeasible constraint, so the sampler learns where the limit
lies); one that only the budget left is too short for is deferred (a FAIL: a later, longer run of the
study may try it). The first measured CPU peak calibrates the memory estimates that follow.

`screen` asks the same questions of a config before it becomes a trial (search/loop/proposals.py), so
that these write-offs are the rare case: a proposal reaches a trial only when it will be run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.core.config import BASELINE, TrialConfig
from autotune.core.outcomes import Reason, Role
from autotune.core.training import shown, training_math
from autotune.search.space import memory
from autotune.search.store import records
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord
from autotune.search.store.results import baseline_trial, failed_classes
from autotune.search.loop import cost
from autotune.search.loop.runner import Events

# Why `screen` keeps a config from becoming a trial (proposals.py counts them when nothing is left).
MEASURED, FAILED_CLASS, TOO_BIG, TOO_SLOW, DEFERRED = "measured", "failed class", "memory", "timeout", "budget left"
Screen = Callable[[TrialConfig], str | None]


class Sizer:
    """A search's memory estimate: `fit` (None: not estimated) and whether a CPU's own share of the peak
    was set by a measured trial yet."""

    def __init__(self, fit: memory.Fit | None, say: Callable[[str], Any]) -> None:
        self.fit, self.say, self._calibrated = fit, say, False

    def writes_off(self, study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, role: str, events: Events) -> bool:
        """Record the proposal's estimate; tell it infeasible, unrun, when it cannot fit (True)."""
        if self.fit is None:
            return False
        estimate = self.fit.recorded(memory.estimate(cfg, self.fit.facts), cfg.gpus)
        records.write(trial, TrialRecord(role=role, config=cfg.knobs(), memory_estimate=estimate))  # type: ignore[arg-type]
        short = self.fit.too_big(cfg)
        if short is not None and role == Role.BASELINE:  # the reference is always measured: said, never dropped
            self.say(f"autotune: the baseline may not fit ({short.removesuffix('; skipped')}); measuring it anyway")
        elif short is not None:
            # Infeasible like an OOM (a constraint), without the minutes an OOM can take to happen.
            records.write(trial, TrialRecord(role=role, reason=Reason.MEMORY_ESTIMATE, message=short))
            trial.set_constraint(FEASIBLE_KEY, 1.0)
            events.finished(study.tell(trial, 0.0))
            return True
        return False

    def calibrate(self, frozen: optuna.trial.FrozenTrial) -> None:
        """On a CPU the peak is the process's RSS, and a trial forked from the warm server holds less of it
        than the probe's cold start did (a fork maps its libraries' pages only as it touches them): the
        first one-process trial measured sets the process's own share for every estimate after it."""
        fit, record = self.fit, TrialRecord.from_frozen(frozen)
        estimate, peak = record.memory_estimate, record.metrics.get("peak_memory_bytes")
        if (
            fit is None
            or fit.facts.device != "cpu"
            or self._calibrated
            or not estimate
            or not peak
            or record.config_for(BASELINE).gpus != 1
            or frozen.state != optuna.trial.TrialState.COMPLETE
        ):
            return
        self.fit, self._calibrated = fit.calibrated(estimate, int(peak)), True
        runtime = self.fit.facts.runtime_bytes
        self.say(
            f"memory: the trial process itself holds {runtime / 2**20:.0f} MiB (trial {frozen.number}'s peak "
            f"less its estimate's parts; the probe's cold start held {fit.facts.runtime_bytes / 2**20:.0f} MiB): "
            "later estimates count that"
        )


@dataclass(frozen=True)
class Limits:
    """The time a proposal's trial would be given: the study's trial timeout (over it, a config could
    never be measured here), and now, that timeout cut to the budget left (over it, not in this run)."""

    timeout_s: float
    given_s: float

    def short(self, est: cost.Estimate | None) -> str | None:
        """TOO_SLOW, DEFERRED, or None when the estimate fits (or there is none)."""
        if est is None or est.seconds <= self.given_s:
            return None
        return TOO_SLOW if est.seconds > self.timeout_s else DEFERRED

    def message(self, est: cost.Estimate, short: str) -> str:
        """Why it is not run first (a live line shows the start), then the estimate's parts."""
        need = f"about {est.seconds:.0f} s to a result"
        if short == TOO_SLOW:
            never = f"more than the trial timeout ({self.timeout_s:.0f} s): it could never finish"
            return f"not run: {need}, {never}; {est.figures()}"
        return (
            f"deferred, not run: {need}, more than the {self.given_s:.0f} s this run could give it (a longer run "
            f"of this study may try it); {est.figures()}"
        )


def cost_writes_off(
    study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, role: str, limits: Limits, events: Events
) -> str | None:
    """Record the proposal's cost estimate; tell a search proposal that cannot finish in the time its
    trial would be given, unrun (TOO_SLOW or DEFERRED), never left to time out; None: launch it. The
    baseline and the warm start always run."""
    est = cost.estimate(cfg, cost.measurements(study, cfg))  # cfg's workload is the study's
    if est is None:
        return None
    records.write(trial, TrialRecord(role=role, cost_estimate_s=round(est.seconds, 2)))
    short = limits.short(est) if role == Role.SEARCH else None
    if short is None:
        return None
    records.write(trial, TrialRecord(role=role, reason=Reason.COST_ESTIMATE, message=limits.message(est, short)))
    if short == TOO_SLOW:  # a property of the config on this machine: infeasible, so the sampler learns it
        trial.set_constraint(FEASIBLE_KEY, 1.0)
        events.finished(study.tell(trial, 0.0))
    else:  # a FAIL is never reused as a measurement: a later run of the study may propose it again
        events.finished(study.tell(trial, state=TrialState.FAIL))
    return short


def screen(study: optuna.Study, sizer: Sizer, base: TrialConfig, limits: Limits) -> Screen:
    """Why a search config would not be run now (a `*` constant above), or None: measured already, in a
    failed class, over the memory estimate, or over the time its trial would be given. The study is read
    once, here, so that a sampler may ask of many configs."""
    # Measured (a pruned config ran long enough to be found slow), or running in another worker now.
    ran = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
    done = {_key(r.config) for r in map(TrialRecord.from_frozen, ran) if not r.contended}
    failed = failed_classes(study)
    ref = baseline_trial(study)
    bn = bool(TrialRecord.from_frozen(ref).applied.get("batch_norm_layers")) if ref is not None else True
    measured = cost.measurements(study, base)

    def why(cfg: TrialConfig) -> str | None:
        if _key(cfg.knobs()) in done:
            return MEASURED
        math = training_math(cfg, bn)
        if math and shown(math) in failed:
            return FAILED_CLASS
        if sizer.fit is not None and sizer.fit.too_big(cfg) is not None:
            return TOO_BIG
        return limits.short(cost.estimate(cfg, measured))

    return why


def _key(knobs: Any) -> tuple[tuple[str, Any], ...]:
    """A config's identity: its knobs, a bool apart from the int it equals."""
    return tuple(sorted((k, (type(v) is bool, v)) for k, v in dict(knobs).items()))
