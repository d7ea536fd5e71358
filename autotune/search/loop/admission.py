"""Admission: the one place that decides whether a proposal runs.

`Admission` reads the study once before each ask, and `why_not` answers for any config: measured already
(or running in another worker now), in a training-math class whose check failed, over the memory
estimate, or over the time its trial would be given (search/loop/cost.py). The sampler's wrapper asks it
of every draw (search/loop/proposals.py), so a proposal reaches a trial only when it will be run; the
session asks it once more of the trial it got (`tell_unrun`), which catches what the draws could not
avoid (an enqueued trial, the last draw of a large space, another worker's trial since the read), and
tells such a trial without running it:

* measured: the earlier trial's figure is reused (a pruned one's pruning; one still running in another
  worker is a FAIL, never reused, since it has no figure yet);
* failed class: infeasible (search/checks/classes.py's write-off);
* memory: infeasible, like an OOM, without the minutes an OOM can take to happen;
* time: a config that could never finish in the trial timeout is infeasible, so the sampler learns where
  the limit lies; one that only the budget left is too short for is deferred (a FAIL: a later, longer run
  of the study may try it).

A trial that runs carries its memory and cost estimates beside what it measures. The baseline always
runs (a proposal that may not fit is said); the warm start is held to memory only. The first measured
CPU peak calibrates the memory estimates that follow (`Sizer.calibrate`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import BASELINE, TrialConfig
from autotune.core.outcomes import Reason, Role, Verdict
from autotune.core.training import shown, training_math
from autotune.search.checks import classes
from autotune.search.loop import cost
from autotune.search.loop.runner import Events
from autotune.search.space import memory
from autotune.search.store import records
from autotune.search.store.records import CheckRecord, ConfigKey, TrialRecord, config_key
from autotune.search.store.results import baseline_trial
from autotune.search.store.telling import tell, tell_infeasible

# Why a config is not run now (`why_not`; proposals.py counts them when nothing is left).
MEASURED, FAILED_CLASS, TOO_BIG, TOO_SLOW, DEFERRED = "measured", "failed class", "memory", "timeout", "budget left"
Screen = Callable[[TrialConfig], str | None]
# Trials whose config counts as measured: a figure (feasible or not), a pruned config found slow, or one
# another worker runs now; the first of each config in this order is the one reused.
MEASURED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


class Sizer:
    """A search's memory estimate: `fit` (None: not estimated) and whether a CPU's own share of the peak
    was set by a measured trial yet."""

    def __init__(self, fit: memory.Fit | None, say: Callable[[str], Any]) -> None:
        self.fit, self.say, self._calibrated = fit, say, False

    def too_big(self, cfg: TrialConfig) -> str | None:
        """Why `cfg` cannot fit, in one line; None when it fits or nothing is estimated."""
        return self.fit.too_big(cfg) if self.fit is not None else None

    def record(self, trial: optuna.Trial, cfg: TrialConfig, role: str) -> None:
        """Record the proposal's estimate beside it; a baseline that may not fit is said (it runs anyway)."""
        if self.fit is None:
            return
        estimate = self.fit.recorded(memory.estimate(cfg, self.fit.facts), cfg.gpus)
        records.write(trial, TrialRecord(role=role, config=cfg.knobs(), memory_estimate=estimate))  # type: ignore[arg-type]
        short = self.too_big(cfg) if role == Role.BASELINE else None
        if short is not None:  # the reference is always measured: said, never dropped
            self.say(f"autotune: the baseline may not fit ({short.removesuffix('; skipped')}); measuring it anyway")

    def write_off(self, study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, role: str) -> FrozenTrial:
        """Tell a proposal that cannot fit infeasible, unrun: a constraint, like an OOM."""
        return tell_infeasible(
            study, trial, TrialRecord(role=role, reason=Reason.MEMORY_ESTIMATE, message=self.too_big(cfg) or "")
        )

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

    def short(self, est: cost.WallTimeEstimate | None) -> str | None:
        """TOO_SLOW, DEFERRED, or None when the estimate fits (or there is none)."""
        if est is None or est.seconds <= self.given_s:
            return None
        return TOO_SLOW if est.seconds > self.timeout_s else DEFERRED

    def message(self, est: cost.WallTimeEstimate, short: str) -> str:
        """Why it is not run first (a live line shows the start), then the estimate's parts."""
        need = f"about {est.seconds:.0f} s to a result"
        if short == TOO_SLOW:
            never = f"more than the trial timeout ({self.timeout_s:.0f} s): it could never finish"
            return f"not run: {need}, {never}; {est.figures()}"
        return (
            f"deferred, not run: {need}, more than the {self.given_s:.0f} s this run could give it (a longer run "
            f"of this study may try it); {est.figures()}"
        )


class Admission:
    """The study as read once before an ask, and what it says of any config: `why_not`, the decision;
    `tell_unrun`, the trial told without running when the decision is not to run it."""

    def __init__(self, study: optuna.Study, sizer: Sizer, base: TrialConfig, limits: Limits) -> None:
        self.study, self.sizer, self.limits = study, sizer, limits
        self._taken: dict[ConfigKey, FrozenTrial] = {}
        for state in MEASURED_STATES:  # a contended figure is not the config's: it is measured again
            for t in study.get_trials(deepcopy=False, states=(state,)):
                r = TrialRecord.from_frozen(t)
                if r.repeat_of is None and not r.contended:
                    self._taken.setdefault(config_key(r.config), t)
        self._failed: dict[str, CheckRecord] = {
            label: check for label, check in records.class_checks(study).items() if check.get("verdict") == Verdict.FAIL
        }
        ref = baseline_trial(study)
        self._bn = bool(TrialRecord.from_frozen(ref).applied.get("batch_norm_layers")) if ref is not None else True
        self._measured = cost.measurements(study, base)

    def why_not(self, cfg: TrialConfig, role: str = Role.SEARCH) -> str | None:
        """Why `cfg`, proposed in `role`, is not run now (a `*` constant above), or None: run it. A search
        proposal answers to all of it; the warm start to memory only; the baseline, the reference every
        speedup divides by, always runs."""
        if role == Role.SEARCH:
            if self._label(cfg) in self._failed:
                return FAILED_CLASS
            if config_key(cfg.knobs()) in self._taken:
                return MEASURED
        if role != Role.BASELINE and self.sizer.too_big(cfg) is not None:
            return TOO_BIG
        return self.limits.short(self.cost(cfg)) if role == Role.SEARCH else None

    def cost(self, cfg: TrialConfig) -> cost.WallTimeEstimate | None:
        """`cfg`'s wall time to a result, from the study's measurements; None with none yet."""
        return cost.estimate(cfg, self._measured)

    def tell_unrun(self, trial: optuna.Trial, cfg: TrialConfig, events: Events) -> str | None:
        """Tell `trial` without running it when `why_not` says so, and return why; else record its
        estimates beside it and return None: launch it."""
        role = TrialRecord.of(trial).role
        why = self.why_not(cfg, role)
        if why == FAILED_CLASS and (label := self._label(cfg)) is not None:
            events.finished(classes.write_off(self.study, trial, cfg, label, self._failed[label]))
            return why
        if why == MEASURED:
            events.finished(reuse(self.study, trial, cfg, self._taken[config_key(cfg.knobs())]))
            return why
        self.sizer.record(trial, cfg, role)
        if why == TOO_BIG:
            events.finished(self.sizer.write_off(self.study, trial, cfg, role))
            return why
        est = self.cost(cfg)
        if est is not None:
            records.write(trial, TrialRecord(role=role, cost_estimate_s=round(est.seconds, 2)))
        if why is None or est is None:
            return None
        record = TrialRecord(role=role, reason=Reason.COST_ESTIMATE, message=self.limits.message(est, why))
        if why == TOO_SLOW:  # a property of the config on this machine: infeasible, so the sampler learns it
            events.finished(tell_infeasible(self.study, trial, record))
        else:  # a FAIL is never reused as a measurement: a later run of the study may propose it again
            records.write(trial, record)
            events.finished(tell(self.study, trial, state=TrialState.FAIL))
        return why

    def _label(self, cfg: TrialConfig) -> str | None:
        """The config's training-math class (batch-norm layers as the baseline's measurement found them)."""
        math = training_math(cfg, self._bn)
        return shown(math) if math else None


def reuse(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, earlier: FrozenTrial) -> FrozenTrial:
    """Tell the sampler what `earlier` found for the same config instead of running it again: its figure, or
    its pruning; the budget goes to configs not yet measured. An earlier trial still running (another
    worker's) has no figure yet: a FAIL, never reused, naming it."""
    if earlier.state == TrialState.RUNNING:
        records.write(
            trial,
            TrialRecord(
                role=Role.SEARCH,
                config=cfg.knobs(),
                repeat_of=earlier.number,
                message=f"not run: trial {earlier.number} runs the same config now",
            ),
        )
        return tell(study, trial, state=TrialState.FAIL)
    record = TrialRecord.from_frozen(earlier)
    records.write(trial, dataclasses.replace(record, role=Role.SEARCH, owner=None, repeat_of=earlier.number))
    if earlier.state == TrialState.PRUNED:
        return tell(study, trial, state=TrialState.PRUNED)
    for key, value in earlier.constraints.items():
        trial.set_constraint(key, value)
    return tell(study, trial, earlier.value)
