"""The memory estimate's part in a search: the model facts, probed once (trial/probe.py, in a process of its
own) or read back from the study; what a config must fit in; each proposal's estimate recorded before it
launches, and one that cannot fit written off unrun; the first measured CPU peak calibrating the rest.
The arithmetic is search/memory.py's."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.outcomes import Reason, Role
from autotune.search import memory, records
from autotune.search.records import StudyRecord, TrialRecord
from autotune.search.runner import FEASIBLE_KEY, Events
from autotune.search.space import Hardware, memory_bytes
from autotune.trial.probe import ProbeError, run_probe

MEMORY_PROBE_ENV = "AUTOTUNE_MEMORY_PROBE"  # "0": no probe, no estimate
PROBE_TIMEOUT_S = 300.0


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


def probe_fit(
    settings: SearchSettings, base: TrialConfig, hw: Hardware, say: Callable[[str], Any]
) -> memory.Fit | None:
    """Measure the model facts once (trial/probe.py, a process of its own) and what a config must fit in:
    the device's memory (RAM on a CPU) less the headroom. None, said, when either is unknown."""
    if os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    if hw.memory_bytes is None:
        say("memory: the device's memory is unknown, so configs are not sized before launch")
        return None
    try:  # in a folder of its own that goes with it: nothing is written before the study is opened
        with tempfile.TemporaryDirectory(prefix="autotune-probe-") as folder:
            facts = run_probe(base, Path(folder), PROBE_TIMEOUT_S)
    except ProbeError as e:
        say(f"memory: no estimate, the model could not be probed ({e}); configs are not sized before launch")
        return None
    return memory.Fit(
        memory.ModelFacts.from_dict(facts),
        int(hw.memory_bytes * (1 - settings.memory_headroom)),
        hw.cuda,
        gpus=hw.gpu_count,
        shared=_ranks_share_gpus(),
    )


def stored_fit(record: StudyRecord, headroom: float) -> memory.Fit | None:
    """A worker's Fit: the facts its study stored, against this machine's memory and GPU count (same
    fingerprint)."""
    if not record.model_facts or os.environ.get(MEMORY_PROBE_ENV, "1") == "0":
        return None
    facts = memory.ModelFacts.from_dict(record.model_facts)
    cuda = facts.device == "cuda"
    total = memory_bytes(cuda)
    if not total:
        return None
    gpus = int((record.fingerprint or {}).get("gpu_count") or 0)
    return memory.Fit(facts, int(total * (1 - headroom)), cuda, gpus=gpus, shared=_ranks_share_gpus())


def _ranks_share_gpus() -> bool:
    from autotune.trial.knobs import ranks_share_gpus  # imports torch: only once a search sizes configs

    return ranks_share_gpus()
