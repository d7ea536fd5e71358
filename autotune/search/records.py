"""One typed record for what the study stores about a trial, and one for the study itself.

Optuna's user attrs are a loose JSON dict; every module that reads or writes them goes through these
records, so a key is spelled in one place and a missing one has one default.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.trial import FrozenTrial

from autotune.core.config import TrialConfig, TrialResult
from autotune.core.training import training_math


@dataclass(frozen=True)
class TrialRecord:
    """A trial's user attrs: who ran it and why, the config it ran, what it measured or why it failed."""

    role: str = "search"
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

    @classmethod
    def from_frozen(cls, t: FrozenTrial) -> TrialRecord:
        return cls.from_attrs(t.user_attrs)

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
        for key in ("config", "owner", "reason", "message", "log_tail", "contended", "speedup", "applied", "repeat_of",
                    "retry_of"):
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

    def knobs(self, workload: TrialConfig) -> TrialConfig:
        return workload.replace(**self.config)


def write(trial: optuna.Trial, record: TrialRecord) -> None:
    for key, value in record.to_attrs().items():
        trial.set_user_attr(key, value)


def of_result(role: str, cfg: TrialConfig, result: TrialResult, speedup: float | None,
              contended: bool) -> TrialRecord:
    math = tuple(training_math(cfg, bool(result.applied.get("batch_norm_layers"))))
    return TrialRecord(role=role, config=cfg.knobs(), contended=contended, speedup=speedup, applied=result.applied,
                       windows=result.windows, metrics=result.metrics(), training_math=math)


@dataclass(frozen=True)
class StudyRecord:
    """A study's user attrs, written once by the process that creates it; workers read them."""

    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    space: Mapping[str, Any] | None = None
    workload: Mapping[str, Any] | None = None
    sampler: str = "tpe"
    trial_timeout_s: float | None = None
    resolved: bool = True  # False: made by `search --create-only`; the first worker resolves the space
    memory_headroom: float | None = None  # the share of memory a config must leave free (workers too)
    parity_steps: int | None = None
    confirm_rounds: int | None = None  # the search's confirmation, run by the worker that finishes last
    confirm_top: int | None = None
    ablation: list[Any] | None = None

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRecord:
        attrs = study.user_attrs
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in attrs.items() if k in names})

    def write(self, study: optuna.Study) -> None:
        for key, value in dataclasses.asdict(self).items():
            if value is not None:
                study.set_user_attr(key, value)
