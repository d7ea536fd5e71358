"""A trial's record in its user attrs: who ran it and why, the config it ran, what it measured or why it
failed; the identity of a config and what became of a trial, read from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict
from collections.abc import Mapping

import optuna
from optuna.study import StudySummary
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import KNOBS, TrialConfig
from autotune.core.result import TrialResult
from autotune.core.errors import AutotuneError
from autotune.core.training import training_math
from autotune.core.outcomes import NOT_RUN, Outcome, Role
from autotune.search.store import _optuna
from autotune.search.space.resolve import as_ran

# The Optuna constraint a written-off or infeasible trial carries (> 0: infeasible), for the sampler.
FEASIBLE_KEY = "infeasible"
Trial = optuna.Trial | FrozenTrial


class MemoryEstimateRecord(TypedDict, total=False):
    """search/space/memory.py's MemoryEstimate.to_dict(): bytes per rank by what holds them, before launch."""

    params: int
    grads: int
    optimizer: int
    activations: int
    runtime: int  # the process itself (CPU only)
    total: int
    strategy: str  # "one process", "ddp x2", "fsdp x4 (offload)"


@dataclass(frozen=True)
class TrialRecord:
    """A trial's user attrs: who ran it and why, the config it ran, what it measured or why it failed."""

    role: str = Role.SEARCH
    config: Mapping[str, Any] = field(default_factory=dict)  # the knobs it ran (TrialConfig.knobs())
    owner: Mapping[str, Any] | None = None  # controller pid/host/started/heartbeat and the trial's pgid
    reason: str | None = None  # a failure's reason (oom, numerics, crash, timeout, pruned, stale, ...)
    message: str = ""
    log_tail: str = ""
    contended: bool = False  # another trial shared the CPU: the timing is suspect
    speedup: float | None = None  # samples/s over the baseline's, when both are known
    applied: Mapping[str, Any] = field(default_factory=dict)
    windows: tuple[float, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)  # TrialResult.metrics(), flat in the attrs
    repeat_of: int | None = None  # the sampler proposed a config already measured there: not run again
    training_math: tuple[str, ...] | None = None  # how its training differs from the baseline's; () = same
    retry_of: int | None = None  # a re-run of that trial, whose measurement was contended
    # search/space/memory.py's estimate, made before launch; shown beside the measured peak (metrics)
    memory_estimate: MemoryEstimateRecord | None = None
    # search/loop/cost.py's estimate of its wall time to a result, made before launch; beside wall_s
    cost_estimate_s: float | None = None
    wall_s: float | None = None  # its measured wall time, launch to result (or to its failure)

    @classmethod
    def of(cls, t: Trial) -> TrialRecord:
        """The record of a trial, running (optuna.Trial) or finished (FrozenTrial)."""
        return cls.from_attrs(t.user_attrs)

    @classmethod
    def from_frozen(cls, t: Trial) -> TrialRecord:
        return cls.of(t)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"metrics"}
        kw = {k: v for k, v in attrs.items() if k in names}
        kw["windows"] = tuple(kw.get("windows") or ())
        if kw.get("training_math") is not None:
            kw["training_math"] = tuple(kw["training_math"])
        metric_keys = set(TrialResult(status="ok").metrics())
        return cls(**kw, metrics={k: v for k, v in attrs.items() if k in metric_keys})

    def to_attrs(self) -> dict[str, Any]:
        """Only what is set, so writing a record never erases what another writer stored."""
        out: dict[str, Any] = {"role": self.role}
        for key in (
            "config",
            "owner",
            "reason",
            "message",
            "log_tail",
            "contended",
            "speedup",
            "applied",
            "repeat_of",
            "retry_of",
            "memory_estimate",
            "cost_estimate_s",
            "wall_s",
        ):
            value = getattr(self, key)
            # By identity, not ==: trial 0 (repeat_of=0, retry_of=0) must not read as "unset" (0 == False).
            if value is None or value is False or value == "" or (isinstance(value, Mapping) and not value):
                continue
            out[key] = dict(value) if isinstance(value, Mapping) else value
        if self.windows:
            out["windows"] = list(self.windows)
        if self.training_math is not None:  # () is a finding ("same"), not "unset"
            out["training_math"] = list(self.training_math)
        out.update(self.metrics)
        return out

    def result(self) -> TrialResult:
        return TrialResult.from_dict({"status": "ok", **self.metrics, "applied": self.applied, "windows": self.windows})

    def config_for(self, base: TrialConfig) -> TrialConfig:
        """The config this trial ran: `base` (the study's workload) with its knobs."""
        return base.replace(**self.knob_values())

    def knob_values(self) -> dict[str, Any]:
        """The stored knobs, and only knobs: the workload (the pipeline to import, the data) is the study's
        and the worker's to decide, so a record that names anything else, written by whoever can write
        the study, is refused rather than applied."""
        extra = sorted(set(self.config) - set(KNOBS))
        if extra:
            raise AutotuneError(f"a trial record sets {', '.join(map(repr, extra))}, which are not knobs: refused")
        return dict(self.config)

    knobs = config_for  # the old name, kept while apply/ablate.py still calls it


def write(trial: optuna.Trial, record: TrialRecord) -> None:
    for key, value in record.to_attrs().items():
        trial.set_user_attr(key, value)


def write_owner(trial: optuna.Trial, owner: Mapping[str, Any]) -> None:
    """The trial's owner alone (its heartbeat, its process groups), as the trial runs."""
    trial.set_user_attr("owner", dict(owner))


def write_reason(trial: optuna.Trial, reason: str) -> None:
    """A failure's reason alone, over the one a failure record wrote (interrupted, budget, compile_timeout)."""
    trial.set_user_attr("reason", reason)


def enqueue(
    study: optuna.Study, params: Mapping[str, Any], record: TrialRecord, *, skip_if_exists: bool = False
) -> None:
    """Queue a trial that runs `params`, carrying `record` (its role, its config) from the start."""
    study.enqueue_trial(dict(params), user_attrs=record.to_attrs(), skip_if_exists=skip_if_exists)


def fail_other(study: optuna.Study, t: FrozenTrial, reason: str, message: str) -> None:
    """Mark another process's RUNNING trial FAIL, with why (Study.tell only takes this process's trials)."""
    _optuna.fail_trial(study, t, {"reason": reason, "message": message})


def contended(t: Trial) -> bool:
    """Whether the trial's figure was measured while another process shared its CPUs."""
    return bool(t.user_attrs.get("contended"))


ConfigKey = tuple[tuple[str, tuple[bool, Any]], ...]


def value_key(value: Any) -> tuple[bool, Any]:
    """A knob value's identity: the value, and whether it is a bool (True is not the count 1, though
    True == 1 in Python)."""
    return type(value) is bool, value


def config_key(values: Mapping[str, Any]) -> ConfigKey:
    """A config's identity, by its knobs (a record's config) or its params (as suggest asks them): the one
    key admission and the coordinate pass tell configs apart by."""
    return tuple(sorted((k, value_key(v)) for k, v in values.items()))


def outcome(t: FrozenTrial) -> Outcome:
    """What became of `t` (core/outcomes.Outcome), from its state, constraints, reason and reuse."""
    if not t.state.is_finished():
        return Outcome.PENDING
    if t.state == TrialState.PRUNED:
        return Outcome.PRUNED
    record = TrialRecord.from_frozen(t)
    if record.reason in NOT_RUN:  # infeasible on an estimate or its class (COMPLETE), or deferred (FAIL)
        return Outcome.WRITTEN_OFF
    if t.state != TrialState.COMPLETE:
        return Outcome.FAILED
    if record.repeat_of is not None:
        return Outcome.REUSED
    if t.value is None or any(v > 0 for v in t.constraints.values()):
        return Outcome.INFEASIBLE
    return Outcome.CONTENDED if record.contended else Outcome.MEASURED


def ran_over_planned(applied: Mapping[str, Any]) -> float:
    """The global batch a trial's ranks delivered over the one its config planned, where the trial observed
    both (a script's loaders counted over ranks: one that divides its own accumulation by the world size
    keeps its batch under torchrun); 1 where it did not."""
    seen = applied.get("global_batch")
    if not isinstance(seen, dict):
        return 1.0
    planned, ran = seen.get("requested"), seen.get("in_effect")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (planned, ran)):
        return 1.0
    return float(ran) / float(planned)  # type: ignore[arg-type]  # both checked numbers above


SAMPLES_PER_S, STEPS_PER_S = "samples/s", "steps/s"


def unit_of(applied: Mapping[str, Any]) -> str:
    """The unit a trial's figure counts (a script's trial records it: samples/s where its loaders delivered
    samples or it handed its batch over, else steps/s); samples/s for every other job."""
    said = applied.get("throughput")
    unit = said.get("unit") if isinstance(said, Mapping) else None
    return unit if unit in (SAMPLES_PER_S, STEPS_PER_S) else SAMPLES_PER_S


def throughput_unit(study: optuna.Study | StudySummary) -> str:
    """The one unit every figure of a study is shown in: its first measured trial's (the baseline's,
    trial 0); samples/s before any trial is measured. A script that counts no samples is measured in
    optimizer steps per second, and every place a figure is shown says steps/s."""
    if isinstance(study, StudySummary):
        return SAMPLES_PER_S
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        applied = t.user_attrs.get("applied")
        if isinstance(applied, Mapping) and "throughput" in applied:
            return unit_of(applied)
    return SAMPLES_PER_S


def of_result(role: str, cfg: TrialConfig, result: TrialResult, speedup: float | None, contended: bool) -> TrialRecord:
    cfg = as_ran(cfg, result.applied, as_written=role == Role.BASELINE)
    math = tuple(training_math(cfg, bool(result.applied.get("batch_norm_layers")), ran_over_planned(result.applied)))
    return TrialRecord(
        role=role,
        config=cfg.knobs(),
        contended=contended,
        speedup=speedup,
        applied=result.applied,
        windows=result.windows,
        metrics=result.metrics(),
        training_math=math,
    )
