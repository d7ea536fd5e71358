"""Admission: what a proposal must pass before it is launched. Its memory estimate is recorded beside it,
and a config that cannot fit is written off unrun (an infeasible constraint, so the sampler learns
where the limit lies); the first measured CPU peak calibrates the estimates that follow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.outcomes import Reason, Role
from autotune.search.space import memory
from autotune.search.store import records
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord
from autotune.search.loop.runner import Events


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
            or record.config.get("gpus", 1) != 1
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
