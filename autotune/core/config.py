"""The frozen config that crosses every boundary (TrialConfig), its knob table and the rules between its knobs;
what a trial measured is core/result.py."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any
from collections.abc import Callable, Mapping

from autotune.core.errors import ConfigError
from autotune.core import knobs as listed
from autotune.core.knobs.row import Knob

PRECISIONS = listed.precision.VALUES
FUSIONS = listed.optimizer_fusion.VALUES
COMPILES = listed.compile.VALUES
PARALLELS = listed.strategy.PARALLELS
FSDP_DTYPES = listed.strategy.FSDP_DTYPES

LR_RULES = ("sqrt", "linear", "none")
# What a script's run shows of it (TrialConfig.shown): how many DataLoaders it built (anywhere), the classes of
# the optimizers that stepped, whether a process group existed when its model first ran (its own), whether it
# seeded torch (in its file or a library's helper).
SHOWN = ("loaders", "optimizers", "own_group", "seeded")
# The baseline's global batch (batch_size 8 on one process): the batch `lr` is meant for when the
# study fixes none (--global-batch), so a config with another global batch trains with a scaled lr.
REFERENCE_BATCH = 8


def _mapping(value: object) -> dict[Any, Any] | None:
    """A mapping, or a list of (key, value) pairs as JSON hands one back, as a dict; None for anything else."""
    try:
        return dict(value) if isinstance(value, (Mapping, list, tuple)) else None
    except (TypeError, ValueError):
        return None


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class TrialConfig:
    """Everything one trial needs. Defaults are a plain PyTorch script (the baseline)."""

    # knobs: each takes its row from its module in the knob list, core/knobs/ (`listed.name.ROW`)
    num_workers: int = listed.loader.ROWS["num_workers"]
    pin_memory: bool = listed.loader.ROWS["pin_memory"]
    batch_size: int = listed.batch_size.ROW
    precision: str = listed.precision.ROW
    optimizer_fusion: str = listed.optimizer_fusion.ROW
    checkpoint_segments: int = listed.checkpoint_segments.ROW
    gpus: int = listed.gpus.ROW
    channels_last: bool = listed.channels_last.ROW
    cudnn_benchmark: bool = listed.cudnn_benchmark.ROW
    tf32: bool = listed.tf32.ROW
    compile: str = listed.compile.ROW
    persistent_workers: bool = listed.loader.ROWS["persistent_workers"]
    prefetch_factor: int | None = listed.loader.ROWS["prefetch_factor"]
    set_to_none: bool = listed.set_to_none.ROW
    num_threads: int = listed.num_threads.ROW
    parallel: str = listed.strategy.ROWS["parallel"]
    fsdp_reshard: bool = listed.strategy.ROWS["fsdp_reshard"]
    fsdp_param_dtype: str = listed.strategy.ROWS["fsdp_param_dtype"]
    fsdp_reduce_dtype: str = listed.strategy.ROWS["fsdp_reduce_dtype"]
    fsdp_offload: bool = listed.strategy.ROWS["fsdp_offload"]
    # workload
    pipeline: str = "unet"
    data_dir: str | None = None
    image_size: int = 128
    warmup_steps: int = 5
    timed_steps: int = 20
    seconds: float | None = None  # time-boxed measurement instead of timed_steps
    window: int = 5  # steps per throughput window, reported for pruning
    # Optimizer steps from the first whose losses the run records, going on untimed after its window until it
    # has them: set on the runs a class's check rides on (trial 0, the baseline's second draw, a class's first
    # trial: search/checks/riding.py); 0: it stops with its window.
    record_steps: int = 0
    seed: int = 0  # initial weights (and the data order unless data_seed is given)
    data_seed: int | None = None  # the data order; None: seed
    lr: float = 1e-3  # for the reference global batch: global_batch, else REFERENCE_BATCH
    lr_scaling: str = "sqrt"  # how lr follows a changed global batch: sqrt | linear | none
    global_batch: int | None = None  # samples per optimizer step, fixed by the study; None: free
    # Micro-batches a script accumulates per optimizer step on its own (it hands over no at.accumulation()):
    # trial 0 counts them from its loaders. Never searched; the global batch counts them. 1 for every other job.
    own_accumulation: int = 1
    # Under a study's global batch, whether the job keeps own_accumulation whatever the config (a script that
    # hands its batch over but calls no at.accumulation()): the batch seam then divides the global batch over
    # the ranks, and only batch_size x gpus x own_accumulation = global_batch is run (admits).
    keeps_accumulation: bool = False
    profile: bool = False
    # The knobs the user trains with today (--baseline), as sorted (knob, value) pairs so the config stays
    # hashable; None: plain PyTorch. Every speedup and training-math label is measured against it.
    baseline: tuple[tuple[str, Any], ...] | None = None
    # What trial 0's run of a script showed of it, wherever in the script or its libraries it happened (sorted
    # (fact, value) pairs, as `baseline`; SHOWN names the facts): the script's knobs and their reasons follow
    # it over its source's first guess. None: no run has shown anything yet (the source decides).
    shown: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        self._pairs(need)
        for k, allowed in CHOICES.items():
            v = getattr(self, k)
            need(v in allowed, f"{k} must be one of {'|'.join(allowed)}, got {v!r}")

        for f in fields(self):
            v = getattr(self, f.name)
            # None is a value only where the type says so; elsewhere it would trip a comparison below.
            if f.type == "int" or (f.type == "int | None" and v is not None):
                need(isinstance(v, int) and not isinstance(v, bool), f"{f.name} must be an integer, got {v!r}")
            if f.type == "bool":
                need(isinstance(v, bool), f"{f.name} must be true or false, got {v!r}")
        need(self.num_workers >= 0, f"num_workers must be >= 0, got {self.num_workers}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.checkpoint_segments >= 0, f"checkpoint_segments must be >= 0, got {self.checkpoint_segments}")
        need(self.gpus >= 1, f"gpus must be >= 1, got {self.gpus}")
        need(self.num_threads >= 0, f"num_threads must be >= 0, got {self.num_threads}")
        need(
            self.prefetch_factor is None or self.prefetch_factor >= 1,
            f"prefetch_factor must be >= 1, got {self.prefetch_factor}",
        )
        need(
            self.num_workers > 0 or (self.prefetch_factor is None and not self.persistent_workers),
            "prefetch_factor and persistent_workers need num_workers > 0",
        )
        need(
            isinstance(self.image_size, int) and self.image_size >= 32,
            f"image_size must be an integer >= 32, got {self.image_size!r}",
        )
        need(self.warmup_steps >= 0 and self.timed_steps >= 1, "warmup_steps must be >= 0 and timed_steps >= 1")
        need(self.window >= 1, f"window must be >= 1, got {self.window}")
        need(self.record_steps >= 0, f"record_steps must be >= 0, got {self.record_steps}")
        need(self.own_accumulation >= 1, f"own_accumulation must be >= 1, got {self.own_accumulation}")
        need(
            self.seconds is None or (_number(self.seconds) and self.seconds > 0),
            f"seconds must be > 0, got {self.seconds!r}",
        )
        # Checked here so a bad lr is exit 2 up front, not a crash inside the trial's optimizer.
        need(_number(self.lr) and math.isfinite(self.lr) and self.lr > 0, f"lr must be a number > 0, got {self.lr!r}")
        need(isinstance(self.pipeline, str) and bool(self.pipeline), "pipeline must be a name or module:factory")
        if self.global_batch is not None:
            need(self.global_batch >= 1, f"global_batch must be >= 1, got {self.global_batch}")
            need(
                self.global_batch % (self.batch_size * self.gpus) == 0,
                f"global_batch {self.global_batch} is not a multiple of batch_size x gpus "
                f"({self.batch_size} x {self.gpus})",
            )

    def _pairs(self, need: Callable[[bool, str], None]) -> None:
        """`baseline` and `shown` in one form, sorted pairs (a mapping from YAML or --baseline, JSON's list of
        pairs), their keys checked."""
        if self.baseline is not None:  # a mapping (YAML, --baseline) or JSON's list of pairs: one form
            pairs = _mapping(self.baseline)
            need(pairs is not None, f"baseline must be a mapping of knobs, got {self.baseline!r}")
            unknown = sorted(map(str, set(pairs) - set(KNOBS)))  # type: ignore[arg-type]
            need(not unknown, f"baseline: unknown knob(s) {', '.join(unknown)} (knobs are: {', '.join(KNOBS)})")
            object.__setattr__(self, "baseline", tuple(sorted(pairs.items())))  # type: ignore[union-attr]
        if self.shown is not None:
            facts = _mapping(self.shown)
            need(facts is not None and set(facts) <= set(SHOWN), f"shown must be a mapping of {', '.join(SHOWN)}")
            # YAML and JSON hand a sequence back as a list: a tuple, so the config stays hashable
            facts = {k: tuple(v) if isinstance(v, list) else v for k, v in (facts or {}).items()}
            object.__setattr__(self, "shown", tuple(sorted(facts.items())))

    # ---- the training this config computes -------------------------------------------------------

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step: derived from the study's global batch, else the job's own
        accumulation (a script's, as trial 0 counted it); never searched on its own."""
        return self.global_batch // (self.batch_size * self.gpus) if self.global_batch else self.own_accumulation

    def admits(self, batch_size: int, gpus: int) -> bool:
        """Whether a micro-batch on a GPU count keeps the study's global batch: it divides it, into the job's
        own accumulation where the job keeps it (keeps_accumulation); any pair without a global batch."""
        if not self.global_batch:
            return True
        steps, rest = divmod(self.global_batch, batch_size * gpus)
        return rest == 0 and (not self.keeps_accumulation or steps == self.own_accumulation)

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step, over every process and accumulated micro-batch."""
        return self.batch_size * self.gpus * self.grad_accum

    def global_batch_with(self, own_accumulation: int) -> int:
        """The global batch it runs for a job that may keep its own accumulation (a script under torchrun that
        keeps its per-rank batch): the study's when it fixes one, else the micro-batch x the ranks x
        `own_accumulation`."""
        if self.global_batch is not None:
            return self.global_batch_size
        return self.batch_size * self.gpus * own_accumulation

    @property
    def reference_batch(self) -> int:
        """The global batch `lr` is meant for: the study's, else the baseline's."""
        given = dict(self.baseline or ())
        return (
            self.global_batch or given.get("batch_size", REFERENCE_BATCH) * given.get("gpus", 1) * self.own_accumulation
        )

    @property
    def effective_lr(self) -> float:
        """lr as training uses it: scaled by `lr_scaling` when the global batch is not the reference."""
        return self.lr * lr_factor(self.global_batch_size / self.reference_batch, self.lr_scaling)

    # ---- the loader this config builds -------------------------------------------------------------

    @property
    def loader_prefetch(self) -> int | None:
        """The prefetch_factor the DataLoader runs with: torch's default (2) when workers load and none is
        given; None without workers (DataLoader refuses one then)."""
        return (self.prefetch_factor or 2) if self.num_workers else None

    @property
    def batches_ahead(self) -> int:
        """Batches the loader's workers make before the first is asked for: workers x prefetch."""
        return self.num_workers * (self.loader_prefetch or 0)

    @property
    def untimed_steps(self) -> int:
        """The optimizer steps before the timed window, for a loader built with these knobs: the warm-up,
        then those that drain what the loader made ahead (what a Trainer must run besides the timed ones,
        and what the cost model prices untimed)."""
        return self.warmup_steps + drain_steps(self.batches_ahead, self.grad_accum, self.warmup_steps)

    @property
    def sharded(self) -> bool:
        """FSDP in effect: parallel fsdp on more than one process (one process trains the plain model)."""
        return self.parallel == "fsdp" and self.gpus > 1

    def one_process(self) -> TrialConfig:
        """This config on one process: the same micro-batch, no strategy to run."""
        return self.replace(gpus=1)

    def knobs(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in KNOBS}

    @property
    def changed(self) -> tuple[str, ...]:
        """The knobs it sets away from its baseline's (baseline_of), in the table's order."""
        base = baseline_of(self)
        return tuple(k for k in KNOBS if getattr(self, k) != getattr(base, k))

    @property
    def is_baseline(self) -> bool:
        """Its knobs are the baseline's (baseline_of): the job as the user runs it, nothing overridden."""
        return not self.changed

    def workload(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in WORKLOAD}
        out["baseline"] = dict(self.baseline) if self.baseline is not None else None  # a mapping in YAML
        out["shown"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.shown} if self.shown else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrialConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialConfig:
        """Build from a flat dict, or from an exported YAML's `config:` + `workload:` sections."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"a config must be a mapping, got {type(d).__name__}")
        if "config" in d and isinstance(d["config"], Mapping):
            d = {**(d.get("workload") or {}), **d["config"]}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s): {', '.join(unknown)} (knobs are: {', '.join(KNOBS)})")
        return cls(**dict(d))


TABLE = tuple(
    Knob(f.name, str(f.type), f.default, **f.metadata["knob"]) for f in fields(TrialConfig) if "knob" in f.metadata
)
# The tuned knobs: names are a contract shared with search spaces and exported YAML.
KNOBS = tuple(k.name for k in TABLE)
# What a trial runs on and how long it measures: fixed for a whole study.
WORKLOAD = tuple(f.name for f in fields(TrialConfig) if f.name not in KNOBS)
# The string knobs and workload fields, with what each may be.
CHOICES = {**{k.name: k.choices for k in TABLE if k.choices}, "lr_scaling": LR_RULES}


def lr_scale(cfg: TrialConfig, own_batch: int) -> float:
    """The factor on the user's own learning rate. It was meant for the user's own global batch (the job
    knows it; the study's reference batch is autotune's), so the rule scales from that batch to the
    config's: a trial at the user's own batch trains at the user's own lr."""
    return lr_factor(cfg.global_batch_size / own_batch, cfg.lr_scaling)


def drain_steps(batches_ahead: int, batches_per_step: int, warmup_steps: int) -> int:
    """Warm-up steps that consume the batches the loaders made ahead: made while the first steps were slow
    (cuDNN autotuning, compilation), timed they would come free and overstate a loader-bound config. None
    without a warm-up: parity and time to target record a loss for exactly their steps from the first one,
    not a speed."""
    if warmup_steps == 0:
        return 0
    return -(-batches_ahead // max(1, batches_per_step))


def whole_batch(global_batch: int | None) -> dict[str, Any]:
    """The fields of a study's global batch (--global-batch) in one micro-batch: a config they build is
    valid for any global batch, before the search picks the micro-batch; none without one."""
    return {"global_batch": global_batch, "batch_size": global_batch} if global_batch else {}


def bare_off(name: str, value: Any) -> Any:
    """YAML 1.1 reads a hand-written bare `off` as False: for a knob whose choices include "off" (compile),
    that can only have meant "off"."""
    return "off" if value is False and "off" in CHOICES.get(name, ()) else value


# What each `needs` waits on: the knob that turns it on, and the values of that knob that do. fsdp's lead,
# parallel, is itself a dependent (of processes), so in_effect follows the chain: fsdp needs both.
LEADS = {"workers": "num_workers", "processes": "gpus", "fsdp": "parallel"}
_TURNS_ON: dict[str, Callable[[Any], bool]] = {
    "workers": lambda n: n > 0,
    "processes": lambda n: n > 1,
    "fsdp": lambda p: p == "fsdp",
}
# The same rule in a user's words: when a dependent is in effect (`autotune knobs`), and why a resolved
# space leaves it at its default (its `space:` note).
IN_EFFECT_WHEN = {"workers": "with num_workers > 0", "processes": "with gpus > 1", "fsdp": "with parallel: fsdp"}
INERT_BECAUSE = {
    "workers": "num_workers is 0",
    "processes": "gpus is 1: one process, nothing to replicate or shard",
    "fsdp": "parallel is not fsdp",
}
_NEEDS = {k.name: k.needs for k in TABLE}


def dependents(needs: str) -> dict[str, Any]:
    """The knobs that mean something only with `needs` ("workers", "processes", "fsdp"), each with the
    default it is left at otherwise."""
    return {k.name: k.default for k in TABLE if k.needs == needs}


def turns_on(needs: str, value: Any) -> bool:
    """Whether `needs`' lead at `value` turns it on, as far as that lead goes (parallel fsdp with one
    process does not shard: in_effect also asks whether the lead itself is in effect)."""
    return _TURNS_ON[needs](value)


def in_effect(knob: str, values: Mapping[str, Any]) -> bool:
    """Whether `knob` means something under `values` (a config's knobs): always for a knob declared
    without `needs`; for a dependent, only where its lead is in effect and turns its `needs` on."""
    needs = _NEEDS[knob]
    if needs is None:
        return True
    lead = LEADS[needs]
    return turns_on(needs, values[lead]) and in_effect(lead, values)


def inert(values: Mapping[str, Any]) -> dict[str, Any]:
    """The dependents not in effect under `values`, each with the default it is left at."""
    return {k.name: k.default for k in TABLE if not in_effect(k.name, values)}


BASELINE = TrialConfig()


def lr_factor(ratio: float, rule: str) -> float:
    """sqrt: Adam-family optimizers (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
    Gradient Algorithms"); linear: SGD's rule (Goyal et al. 2017); none: keep lr."""
    return {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[rule]


def baseline_of(cfg: TrialConfig) -> TrialConfig:
    """The run `cfg` is compared with: the same workload with the user's baseline knobs (--baseline), or
    plain PyTorch. With a study's global batch and no batch size given, it trains at the plain batch
    (or the largest divisor of the global batch below it) and accumulates the rest: --global-batch is
    for a batch that may not fit in one pass, so the reference must not be run in one. A job that keeps its
    own accumulation trains at the one micro-batch that keeps the global batch (admits)."""
    given = dict(cfg.baseline or ())
    knobs = {**BASELINE.knobs(), **given}
    if cfg.global_batch and "batch_size" not in given:
        per_process = max(1, cfg.global_batch // knobs["gpus"])
        fits = [d for d in range(1, per_process + 1) if cfg.admits(d, knobs["gpus"])]
        knobs["batch_size"] = max((d for d in fits if d <= BASELINE.batch_size), default=min(fits, default=1))
    return cfg.replace(**knobs)
