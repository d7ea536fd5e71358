"""Typed records of everything a study stores in Optuna's user attrs: a trial's record, the study's
own record, and the study attrs the end of a search and a fleet of workers keep.

Optuna's user attrs are a loose JSON dict; every module reads and writes them through this one, so a
key is spelled in one place and a missing one has one default (tests/test_architecture.py holds it).
The stored values stay plain JSON (a resumed study, optuna-dashboard and other versions read them);
the TypedDicts below name their shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
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

# ---- the study attrs' keys ----------------------------------------------------------------------------

# The Optuna constraint a written-off or infeasible trial carries (> 0: infeasible), for the sampler.
FEASIBLE_KEY = "infeasible"

CONFIRMATION = "confirmation"  # the last confirmation's summary (search/loop/confirm.py)
# Trial number (str) -> the gate's check of it (search/loop/gate.py). A study attr, because a finished
# trial's own attrs can no longer be written.
PARITY = "parity"
# One attr per training-math class checked: "class:<hash of its label>" -> its check, label included
# (parity for a class that keeps the optimizer step, time to target for one that changes it;
# search/checks/classes.py). One key each, so fleet workers finishing checks at once never drop one another's.
CLASS_PREFIX = "class:"
CLASSES = "class_verdicts"  # how studies before per-class keys stored them: one dict, read still
REFERENCE = "parity_reference"  # parity.Reference.to_dict(), measured once per study
WORKER_PREFIX = "worker:"  # one attr per fleet worker: "worker:<host>:<pid>:<uuid>" -> WorkerEntry
RESOLVER = "resolver"  # the claim of the worker that resolves a `--create-only` study's space
FINISHER = "finisher"  # the claim of the worker that finishes a fleet's study

Trial = optuna.Trial | FrozenTrial


class CheckRecord(TypedDict, total=False):
    """A check of a config's training as stored: a class's (class_checks) or the gate's on a candidate
    (gate_checks); made by parity.ParityResult.to_dict() or target.TargetResult.to_dict(), or written
    without a run (`not checked`, with the reason). Its `verdict` is the word (core/outcomes.Verdict)."""

    kind: str  # parity | time to target
    verdict: str  # pass | fail | not checked | skipped
    reason: str
    trial: int  # the trial whose check it was
    seconds: float  # the check's wall time
    rule: str  # the rule it applied, in words
    failure: str  # the candidate's TrialFailure reason, when it failed to train
    # parity (search/checks/parity.py)
    steps: int
    samples: int
    deviation: float | None
    tolerance: float | None
    noise: float | None
    candidate_steps: int
    baseline_steps: int
    runs: int
    # time to target (search/checks/target.py)
    target_loss: float
    baseline_samples_to_target: int | None
    samples_to_target: int | None
    cap_samples: int
    speedup_to_target: float | None


class ConfirmationSummary(TypedDict, total=False):
    """confirm.summarize() and the measured seconds per trial."""

    rounds: int
    baseline_median: float | None
    rows: list[dict[str, Any]]  # label, trial, search_samples_per_s, samples, median, min, max, ratios, speedups
    winner: int | None
    order_changed: bool
    search_order: list[str]
    confirmed_order: list[str]
    trial_s: float | None


class MemoryEstimateRecord(TypedDict, total=False):
    """search/space/memory.py's MemoryEstimate.to_dict(): bytes per rank by what holds them, before launch."""

    params: int
    grads: int
    optimizer: int
    activations: int
    runtime: int  # the process itself (CPU only)
    total: int
    strategy: str  # "one process", "ddp x2", "fsdp x4 (offload)"


class WorkerEntry(TypedDict, total=False):
    """A fleet worker: who it is, and whether it is still running."""

    host: str
    pid: int
    started: float
    state: str  # running | done
    heartbeat: float


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
    ablation: list[Any] | None = None  # `autotune ablate`'s steps (apply/ablate.py), written by write_ablation
    model_facts: Mapping[str, Any] | None = None  # memory.ModelFacts.to_dict(), probed once; write_model_facts
    # Why the last run's trial loop ended (search/loop/session.py's Stop, its word); write_stop_reason
    stop_reason: str | None = None

    @classmethod
    def of(cls, study: optuna.Study | StudySummary) -> StudyRecord:
        """The record of a study, or of a study summary (optuna.get_all_study_summaries)."""
        attrs = study.user_attrs
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in attrs.items() if k in names})

    def write(self, study: optuna.Study) -> None:
        for key, value in dataclasses.asdict(self).items():
            if value is not None:
                study.set_user_attr(key, value)


def write_rebased(study: optuna.Study, workload: Mapping[str, Any], space: Mapping[str, Any]) -> None:
    """The study's workload and space once trial 0 showed the script's own batch (search/loop/session.py): the
    workers that join from here read the baseline and the space the rest of the search runs."""
    study.set_user_attr("workload", dict(workload))
    study.set_user_attr("space", dict(space))


def write_ablation(study: optuna.Study, steps: list[Any]) -> None:
    """`autotune ablate`'s steps alone (StudyRecord.write would write every field)."""
    study.set_user_attr("ablation", steps)


def write_model_facts(study: optuna.Study, facts: Mapping[str, Any]) -> None:
    """The memory estimate's model facts alone, as the process that probed them measured them."""
    study.set_user_attr("model_facts", dict(facts))


def write_stop_reason(study: optuna.Study, stop: str) -> None:
    """Why a run's trial loop ended, alone: each run of the study (a resumed search, a fleet's worker)
    writes its own, so the study holds the last one's."""
    study.set_user_attr("stop_reason", str(stop))


# ---- the end of a search: confirmation, parity, class checks -------------------------------------------


def confirmation(study: optuna.Study) -> ConfirmationSummary | None:
    """The last confirmation's summary; None when none ran."""
    return study.user_attrs.get(CONFIRMATION)


def write_confirmation(study: optuna.Study, summary: ConfirmationSummary | Mapping[str, Any]) -> None:
    study.set_user_attr(CONFIRMATION, dict(summary))


def gate_checks(study: optuna.Study) -> dict[str, CheckRecord]:
    """The parity gate's checks by trial number (as a str key); {} when the gate checked none."""
    return dict(study.user_attrs.get(PARITY) or {})


def gate_check(study: optuna.Study, number: int) -> CheckRecord | None:
    """The gate's check of trial `number`, when it made one."""
    return gate_checks(study).get(str(number))


def write_gate_checks(study: optuna.Study, checks: Mapping[str, CheckRecord]) -> None:
    study.set_user_attr(PARITY, dict(checks))


def class_checks(study: optuna.Study) -> dict[str, CheckRecord]:
    """The check of each training-math class checked, by its label; {} when none was."""
    attrs = study.user_attrs
    out: dict[str, CheckRecord] = dict(attrs.get(CLASSES) or {})
    for k, v in attrs.items():
        if k.startswith(CLASS_PREFIX) and isinstance(v, dict) and "label" in v:
            out[str(v["label"])] = {key: val for key, val in v.items() if key != "label"}  # type: ignore[assignment]
    return out


def class_key(label: str) -> str:
    """A class's attr key: a hash, since a label can outgrow a storage's indexed key column."""
    return CLASS_PREFIX + hashlib.sha256(label.encode()).hexdigest()[:20]


def write_class_check(study: optuna.Study, label: str, check: CheckRecord) -> None:
    """One write of the class's own key: no read-modify-write of a shared dict."""
    study.set_user_attr(class_key(label), {**check, "label": label})


def parity_reference(study: optuna.Study) -> dict[str, Any] | None:
    """The baseline's stored reference trajectory (parity.Reference.to_dict()); None before it is measured."""
    return study.user_attrs.get(REFERENCE) or None


def write_parity_reference(study: optuna.Study, reference: Mapping[str, Any]) -> None:
    study.set_user_attr(REFERENCE, dict(reference))


CEILING = "ceiling"  # {"trial": number, **section}: search/loop/export_ceiling.py's measurement of the export


def ceiling(study: optuna.Study | StudySummary, number: int) -> dict[str, Any] | None:
    """The ceiling measured for trial `number`, without its trial key; None when it was not measured."""
    value = study.user_attrs.get(CEILING)
    if not isinstance(value, Mapping) or value.get("trial") != number:
        return None
    return {k: v for k, v in value.items() if k != "trial"}


def write_ceiling(study: optuna.Study, number: int, section: Mapping[str, Any]) -> None:
    study.set_user_attr(CEILING, {"trial": number, **section})


ALONE = "alone"  # a script study's alone rounds (search/loop/alone.py; what they decide: search/store/last_word.py)


def alone(study: optuna.Study) -> dict[str, Any] | None:
    """The last alone rounds' record; None when none was made."""
    value = study.user_attrs.get(ALONE)
    return dict(value) if isinstance(value, Mapping) else None


def write_alone(study: optuna.Study, record: Mapping[str, Any]) -> None:
    study.set_user_attr(ALONE, dict(record))


# ---- a fleet's workers and its claims ------------------------------------------------------------------


def worker_key(host: str, pid: int, unique: str) -> str:
    return f"{WORKER_PREFIX}{host}:{pid}:{unique}"


def worker(study: optuna.Study, key: str) -> WorkerEntry:
    """The worker stored under `key`; {} when there is none."""
    return dict(study.user_attrs.get(key) or {})  # type: ignore[return-value]


def workers(study: optuna.Study) -> dict[str, WorkerEntry]:
    """Every worker recorded in the study, by key (entries that are not a worker's mapping left out)."""
    return {
        k: WorkerEntry(**v) for k, v in study.user_attrs.items() if k.startswith(WORKER_PREFIX) and isinstance(v, dict)
    }


def write_worker(study: optuna.Study, key: str, entry: WorkerEntry | Mapping[str, Any]) -> None:
    study.set_user_attr(key, dict(entry))


def claimant(study: optuna.Study, claim: str) -> Any:
    """Who holds the claim `claim` (RESOLVER, FINISHER) as the study was loaded; None: nobody."""
    return study.user_attrs.get(claim)


def write_claim(study: optuna.Study, claim: str, me: str) -> None:
    study.set_user_attr(claim, me)


DRAWS = "baseline_draws"  # the baseline's further draws, each in its own process (search/loop/draws.py)


def baseline_draws(study: optuna.Study | StudySummary) -> list[float]:
    """The samples/s of each further draw of the baseline; [] when none was made."""
    value = study.user_attrs.get(DRAWS)
    return [float(x) for x in value if isinstance(x, (int, float))] if isinstance(value, list) else []


def write_baseline_draw(study: optuna.Study, samples_per_s: float) -> None:
    study.set_user_attr(DRAWS, [*baseline_draws(study), float(samples_per_s)])
