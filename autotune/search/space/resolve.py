"""Resolving a space: narrowed, in one pass, to what can have an effect here and fit. The hardware
(devices, CPUs, native bf16, apex), the pipeline (its stages, the knobs it cannot route), the study's
global batch (the micro-batch and accumulation that keep it) and the memory estimate (the micro-batches
each rank can hold). Each narrowing says what it dropped and why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune import pipelines
from autotune.pipelines import script as script_job
from autotune.pipelines.script import ITERABLE_KEPT, LOADER_KNOBS
from autotune.core import knobs as described
from autotune.core.knobs.row import Clip, Drop, Fix, Rule
from autotune.core.config import INERT_BECAUSE, KNOBS, LEADS, TABLE, TrialConfig, baseline_of, dependents
from autotune.core.errors import ConfigError, SearchSpaceError
from autotune.core.settings import SearchSettings
from autotune.search.space import memory
from autotune.search.space.machine import Hardware
from autotune.search.space.spec import (
    _DEFAULTS,
    Choices,
    Fixed,
    IntRange,
    SearchSpace,
    Spec,
    can_turn_on,
    singles,
    spec_values,
)


# The knobs that do nothing without CUDA: fixed off on such a machine, so never a measured value (the diff
# never writes them from a study made there): pinned memory, and the process flags the knob list fixes so.
NO_EFFECT_WITHOUT_CUDA = {
    "pin_memory": "no CUDA, pinning memory is a no-op",
    **{
        k.NAME: rule.why
        for k in described.FLAGS
        for rule in k.machine(Hardware(cuda=False, gpu_count=0, cpu_count=1, apex=False))
        if isinstance(rule, Fix)
    },
}


def resolve(
    space: SearchSpace, pipeline: Any, settings: SearchSettings, base: TrialConfig, say: Callable[[str], Any]
) -> tuple[SearchSpace, Hardware, memory.Fit | None]:
    """The space a study searches: narrowed to this machine, this pipeline, the study's global batch and
    the memory each micro-batch needs, with a `space:` line said for every change."""
    hw = Hardware.detect()
    space, notes = for_hardware(
        space,
        hw,
        stages=pipelines.stage_count(pipeline),
        unsupported=pipelines.unsupported_of(pipeline),
        own=dict(base.baseline or ()),
    )
    space, more = by_global_batch(space, base)
    fit = memory.probe_fit(settings, base, hw, say)
    if fit is not None:
        space, dropped = by_memory(space, base, fit)
        more += dropped
    for note in notes + more:
        say(f"space: {note}")
    return space, hw, fit


def for_hardware(
    space: SearchSpace,
    hw: Hardware,
    stages: int | None = None,
    unsupported: frozenset[str] = frozenset(),
    own: Mapping[str, Any] | None = None,
) -> tuple[SearchSpace, list[str]]:
    """Narrow `space` to what can have an effect on `hw`; return it with one note per change. own: the
    baseline's knobs (the job's own, as the study records them): a knob the job keeps is fixed at its own
    value where the study knows it, so every record says what the job ran."""
    n = _Narrowing(space.source, dict(space.knobs))
    _by_pipeline(n, space, unsupported, own or {})
    _by_machine(n, hw)
    for k in described.ALL:  # the pipeline's stages (checkpointing's)
        for rule in getattr(k, "on_stages", lambda s: [])(stages):
            n.follow(k.NAME, rule)
    _fix_inert(n, hw)
    return SearchSpace(knobs=singles(n.knobs), source=space.source), n.notes


def _by_pipeline(n: _Narrowing, space: SearchSpace, unsupported: frozenset[str], own: Mapping[str, Any]) -> None:
    """The knobs the pipeline cannot route left at the job's own value (else the default), and the values it
    cannot run dropped; a space that asks only for a parallel mode the pipeline lacks is refused."""
    parallel = space.knobs.get("parallel")
    if "parallel" in unsupported and parallel is not None and "ddp" not in spec_values(parallel):
        # Asked for fsdp only: narrowing it to ddp would search something else than what the file says.
        raise n.fail(
            "parallel", f"fsdp: {getattr(unsupported, 'why', {}).get('parallel') or 'not supported by this pipeline'}"
        )
    for k in sorted(unsupported):
        if k not in KNOBS:
            raise SearchSpaceError(f"{space.source}: knob {k!r}: marked unsupported but is not a knob")
        why = getattr(unsupported, "why", {}).get(k)  # a framework job says why (pipelines.frameworks)
        n.leave(k, own.get(k, getattr(_DEFAULTS, k)), "not supported by this pipeline" + (f": {why}" if why else ""))
    for k, refused in getattr(unsupported, "values", {}).items():  # a value the pipeline cannot run (fp16 unscaled)
        for value, why in refused.items():
            n.keep(
                k, lambda v, value=value: v != value, f"not supported by this pipeline: {why}", against="the pipeline"
            )


def _by_machine(n: _Narrowing, hw: Hardware) -> None:
    """The devices, CPUs, native bf16 and apex this machine has."""
    for k in sorted(described.ALL, key=lambda k: KNOBS.index(k.NAME)):  # said in the table's order
        for rule in getattr(k, "machine", lambda hw: [])(hw):
            n.follow(k.NAME, rule)
    if not hw.cuda:
        n.fix("pin_memory", False, NO_EFFECT_WITHOUT_CUDA["pin_memory"])
    n.clip("num_workers", hw.cpu_count, f"{hw.cpu_count} CPUs")


def _fix_inert(n: _Narrowing, hw: Hardware) -> None:
    """The dependents no value left in the space can turn on, fixed at their inert values; without CUDA, the
    fsdp knobs that only move work to or from host memory."""
    # A dependent whose lead no value left in the space turns on is inert. In LEADS order, after the leads
    # are narrowed: with one process parallel is fixed to ddp, and that fixes the fsdp knobs in turn.
    for needs in LEADS:
        if not can_turn_on(needs, n.knobs):
            for k, inert in dependents(needs).items():
                n.fix(k, inert, INERT_BECAUSE[needs])
    if not hw.cuda and can_turn_on("fsdp", n.knobs):
        n.fix("fsdp_offload", False, "no CUDA: the parameters already live in host memory")
        if not hw.cpu_bf16:
            n.keep("fsdp_param_dtype", lambda d: d != "bf16", "this CPU has no native bf16 (AVX512-BF16 or AMX)")


@dataclass
class _Narrowing:
    """A space being narrowed to the hardware: its knobs so far, and one note per change."""

    source: str
    knobs: dict[str, Spec]
    notes: list[str] = field(default_factory=list)

    def fail(self, knob: str, msg: str) -> SearchSpaceError:
        return SearchSpaceError(f"{self.source}: knob {knob!r}: {msg}")

    def fix(self, knob: str, value: Any, why: str) -> None:
        if knob in self.knobs and self.knobs[knob] != Fixed(value):
            self.knobs[knob] = Fixed(value)
            self.notes.append(f"{knob} fixed to {value!r}: {why}")

    def follow(self, knob: str, rule: Rule) -> None:
        """A knob's own rule (autotune/core/knobs/): fixed, values dropped, or clipped, and why."""
        if isinstance(rule, Fix):
            self.fix(knob, rule.value, rule.why)
        elif isinstance(rule, Drop):
            self.keep(knob, lambda v: v not in rule.values, rule.why)
        elif isinstance(rule, Clip):
            self.clip(knob, rule.high, rule.why, rule.strict)

    def leave(self, knob: str, value: Any, why: str) -> None:
        """Fix a knob the job keeps as its own: the value is only what the config records (autotune's
        default), not what the job runs, so the note names none."""
        if knob in self.knobs and self.knobs[knob] != Fixed(value):
            self.knobs[knob] = Fixed(value)
            self.notes.append(f"{knob} not searched: {why}")

    def keep(self, knob: str, ok: Any, why: str, against: str = "the hardware") -> None:
        """Drop the values `ok` rejects; a space left with none is an error (its choices conflict with
        `against`)."""
        spec = self.knobs.get(knob)
        if spec is None:
            return
        vals = (
            [spec.value]
            if isinstance(spec, Fixed)
            else list(spec.values())
            if isinstance(spec, IntRange)
            else list(spec.values)
        )
        kept = [v for v in vals if ok(v)]
        if not kept:
            raise self.fail(knob, f"choices conflict with {against}: {why}")
        if len(kept) < len(vals):
            self.notes.append(f"{knob}: dropped {', '.join(map(str, [v for v in vals if not ok(v)]))} ({why})")
            self.knobs[knob] = Choices(tuple(kept))

    def clip(self, knob: str, top: int, why: str, strict: bool = False) -> None:
        """Lower the maximum to `top`. strict: values above it are errors, not clipped."""
        spec = self.knobs.get(knob)
        if spec is None:
            return
        if isinstance(spec, Fixed):
            if spec.value is not None and spec.value > top:
                if strict:
                    raise self.fail(knob, f"{knob}={spec.value} but {why}")
                self.fix(knob, top, why)
        elif isinstance(spec, IntRange):
            self._clip_range(knob, spec, top, why, strict)
        else:
            if strict:
                kept = tuple(v for v in spec.values if v <= top)
            else:
                kept = tuple(dict.fromkeys(v if v is None else min(v, top) for v in spec.values))
            if not kept:
                raise self.fail(knob, f"{knob}={min(spec.values)} but {why}")
            if kept != spec.values:
                self.knobs[knob] = Choices(kept)
                self.notes.append(f"{knob}: choices limited to {list(kept)} ({why})")

    def _clip_range(self, knob: str, spec: IntRange, top: int, why: str, strict: bool) -> None:
        if spec.high <= top:
            return
        if spec.low > top:
            if strict:
                raise self.fail(knob, f"{knob}={spec.low} but {why}")
            self.fix(knob, top, why)
            return
        high = spec.low + (top - spec.low) // spec.step * spec.step
        if high == spec.low:
            self.fix(knob, high, why)
        else:
            self.knobs[knob] = IntRange(spec.low, high, spec.step, spec.log)
            self.notes.append(f"{knob}: range clipped to {spec.low}..{high} ({why})")


# ------------------------------------------------------------- the global batch


def _values(spec: Spec | None, default: int) -> list[int]:
    return [default] if spec is None else spec_values(spec)


def _as_spec(values: list[int]) -> Spec:
    return Fixed(values[0]) if len(values) == 1 else Choices(tuple(values))


def by_global_batch(space: SearchSpace, base: TrialConfig) -> tuple[SearchSpace, list[str]]:
    """`space` with batch_size and gpus kept to divisors of the study's global batch (base.admits), and one
    note per drop; for a job that keeps its own accumulation, batch_size is the global batch divided over
    each GPU count's ranks. A global batch nothing in the space divides is bad input (SearchSpaceError, exit 2)."""
    global_batch = base.global_batch
    if global_batch is None:
        return space, []
    knobs = dict(space.knobs)
    batches = _values(knobs.get("batch_size"), base.batch_size)
    gpus_all = _values(knobs.get("gpus"), base.gpus)
    notes = []
    if base.keeps_accumulation and "batch_size" in knobs:
        # Not a free knob: each GPU count runs the global batch divided over its ranks.
        per_step = base.own_accumulation
        batches = sorted({global_batch // (g * per_step) for g in gpus_all if global_batch % (g * per_step) == 0})
        if batches:
            knobs["batch_size"] = _as_spec(batches)
            notes.append(
                f"batch_size: {', '.join(map(str, batches))}, the global batch {global_batch} divided over each GPU "
                f"count's ranks (the script accumulates its own {per_step} micro-batch(es) per step: it calls no "
                "at.accumulation())"
            )
    gpus = [g for g in gpus_all if any(base.admits(b, g) for b in batches)]
    kept = [b for b in batches if any(base.admits(b, g) for g in gpus)]
    if not kept:
        raise SearchSpaceError(
            f"--global-batch {global_batch}: no micro-batch x GPU count in the space divides it "
            f"(batch_size {batches}, gpus {gpus_all})"
        )
    steps = f"its own {base.own_accumulation}" if base.keeps_accumulation else "a whole number of"
    for knob, before, after in (("gpus", gpus_all, gpus), ("batch_size", batches, kept)):
        if after != before and knob in knobs:
            dropped = [v for v in before if v not in after]
            notes.append(
                f"{knob}: dropped {', '.join(map(str, dropped))} (global batch {global_batch} must be "
                f"batch_size x gpus x {steps} accumulation steps, for some "
                f"{'batch_size' if knob == 'gpus' else 'GPU count'} in the space)"
            )
            knobs[knob] = _as_spec(after)
    return SearchSpace(knobs=knobs, source=space.source), notes


# The knobs the table declares as changing the memory estimate.
MEMORY_KNOBS = tuple(k.name for k in TABLE if k.memory)


def by_memory(space: SearchSpace, base: TrialConfig, fit: memory.Fit) -> tuple[SearchSpace, list[str]]:
    """Drop the micro-batch sizes that no strategy in the space fits, and say so. The baseline's never
    goes: it is always measured (a baseline that does not fit fails as measured, and says why)."""
    spec = space.knobs.get("batch_size")
    if spec is None or isinstance(spec, Fixed):
        return space, []
    sizes = spec_values(spec)
    axes = [  # each memory knob's values: the space's, or the workload's own when it is not searched
        [(k, v) for v in (spec_values(space.knobs[k]) if k in space.knobs else [getattr(base, k)])]
        for k in MEMORY_KNOBS
        if hasattr(base, k)
    ]
    keep = baseline_of(base).batch_size
    dropped: dict[int, tuple[int, str, str]] = {}
    for b in sizes:
        fits = []
        for combo in itertools.product(*axes):  # every combination of the memory knobs' values
            try:
                c = base.replace(batch_size=b, **dict(combo))
            except ConfigError:  # a combination the workload refuses (a GPU count its global batch refuses)
                continue
            e = memory.estimate(c, fit.facts)
            fits.append((fit.needed(e, c.gpus), e.strategy, fit.where(c.gpus)))
        least = min(fits, default=None)
        if least is not None and least[0] > fit.usable and b != keep:
            dropped[b] = least
    if not dropped:
        return space, []
    kept = tuple(v for v in sizes if v not in dropped)
    knobs = {**space.knobs, "batch_size": Fixed(kept[0]) if len(kept) == 1 else Choices(kept)}
    notes = [
        f"batch_size: dropped {b} (batch {b}: estimated {memory.gib(need)} {where} even under {how}, "
        f"> {memory.gib(fit.usable)} usable)"
        for b, (need, how, where) in dropped.items()
    ]
    return SearchSpace(knobs=knobs, source=space.source), notes


__all__ = ["by_global_batch", "by_memory", "for_hardware", "resolve"]


# ---- the batch a script runs as its own, as trial 0 showed it -------------------------------------------------


def as_ran(cfg: TrialConfig, applied: Mapping[str, Any], as_written: bool) -> TrialConfig:
    """The config a script's trial ran. Where it ran the script's own batch (the baseline runs the script as
    written; a script that hands no batch over keeps its own) and its run reported that batch (at.batch_size()'s
    default as the script handed it, after a configurator or a config file; what its loaders delivered), the
    config records that batch, and its baseline with it, however the source read it. The accumulation the
    run showed as the script's own is recorded too: every trial keeps it. `cfg` otherwise, and under a
    study's global batch, whose micro-batch the baseline picks."""
    script = applied.get("script")
    if as_written and isinstance(script, Mapping) and (loaders := own_loader(cfg, applied)):
        # its own `-j 2`, its pinning: what the baseline ran, as every knob its run did not change
        cfg = cfg.replace(**loaders, baseline=tuple(sorted({**dict(cfg.baseline or ()), **loaders}.items())))
    own = script.get("own") if isinstance(script, Mapping) else None
    batch = own.get("batch_size") if isinstance(own, Mapping) else None
    if not _count(batch) or cfg.global_batch is not None:
        return cfg
    assert isinstance(script, Mapping) and isinstance(own, Mapping)
    accumulation = own.get("accumulation")
    cfg = cfg.replace(own_accumulation=accumulation if _count(accumulation) else cfg.own_accumulation)
    handed = bool((script.get("api_calls") or {}).get("batch_size"))
    if (handed and not as_written) or batch == cfg.batch_size:
        return cfg
    baseline = {**dict(cfg.baseline or ()), "batch_size": batch}
    return cfg.replace(batch_size=batch, baseline=tuple(sorted(baseline.items())))


def rebased(base: TrialConfig, applied: Mapping[str, Any]) -> TrialConfig | None:
    """The study's workload rebased on what trial 0's run reported as the script's own (its record's
    `applied`): its batch (at.batch_size()'s default as handed over, what a kept loader delivered), its
    accumulation (the batches its loaders delivered per optimizer step) and the lr its optimizer was built
    with, where the workload does not record them (the source could not say them: even where the batch
    is autotune's default 8, it is known only now), unless the study fixes the global batch (the trials
    hand the batch and accumulation over: only the accumulation of a script that keeps its own); and what its
    model showed of a model knob it sets itself (`watched_own`: the precision its own autocast ran). None when
    nothing changes."""
    changes: dict[str, Any] = {}
    baseline = dict(base.baseline or ())
    script = applied.get("script")
    own = script.get("own") if isinstance(script, Mapping) else None
    if isinstance(own, Mapping) and _count(own.get("batch_size")) and base.global_batch is None:
        accumulation = own.get("accumulation")
        lr = (applied.get("lr") or {}).get("requested")
        baseline["batch_size"] = own["batch_size"]
        changes["own_accumulation"] = accumulation if _count(accumulation) else base.own_accumulation
        good = isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0
        changes["lr"] = float(lr) if good and lr is not None else base.lr
    elif isinstance(own, Mapping) and base.keeps_accumulation and _count(own.get("accumulation")):
        changes["own_accumulation"] = own["accumulation"]  # the batch seam divides the global batch by it
    if (shown := shown_of(applied)) is not None and dict(base.shown or ()) != shown:
        changes |= shown_changes(base, shown)
    if isinstance(script, Mapping):
        baseline |= own_loader(base, applied)
    model = script.get("model") if isinstance(script, Mapping) else None
    if isinstance(model, Mapping):  # what the baseline's model showed of each knob the script sets itself
        kept = baseline_of(base)
        for knob in described.MODEL:
            read = getattr(knob, "watched_own", None)
            if read is not None and (ran := read(model)) is not None and ran != getattr(kept, knob.NAME):
                baseline[knob.NAME] = ran
    changes["baseline"] = tuple(sorted(baseline.items())) or None
    after = base.replace(**changes)
    return None if after == base else after


def shown_of(applied: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a script's run showed of it (TrialConfig.shown), from its record's `applied`: the DataLoaders it
    built wherever it built them, the classes of the optimizers that stepped, whether its own process group
    existed; None: not a script's record."""
    script = applied.get("script")
    if not isinstance(script, Mapping) or not isinstance(script.get("loaders"), list):
        return None
    stepped = [o.get("type") for o in script.get("optimizers") or () if isinstance(o, Mapping)]
    return {
        "loaders": len(script["loaders"]),
        "optimizers": tuple(dict.fromkeys(str(t) for t in stepped if t)),
        "own_group": script.get("process_group") == "own",
        "seeded": bool(script.get("seeded")),
    }


def shown_changes(base: TrialConfig, shown: Mapping[str, Any]) -> dict[str, Any]:
    """The workload's `shown`, and the lr rule of the optimizer that stepped where the study's rule was the one
    its source's guess gave (not one the user chose)."""
    changes: dict[str, Any] = {"shown": tuple(sorted(shown.items()))}
    guess = script_job.load(base.replace(shown=None)).lr_rule
    if base.lr_scaling == guess:
        changes["lr_scaling"] = script_job.load(base.replace(**changes)).lr_rule
    return changes


def own_loader(cfg: TrialConfig, applied: Mapping[str, Any]) -> dict[str, Any]:
    """The loader knobs a script's run as written showed in effect away from `cfg`'s baseline (its own `-j 2`,
    its pinning), where its loader takes them (not an IterableDataset's, which every trial keeps)."""
    out: dict[str, Any] = {}
    own = baseline_of(cfg)
    for k in LOADER_KNOBS:
        effect = applied.get(k)
        ran = effect.get("in_effect") if isinstance(effect, Mapping) else None
        if isinstance(effect, Mapping) and not str(effect.get("why")).startswith(ITERABLE_KEPT):
            if ran != getattr(own, k) and _knob_value(k, ran):
                out[k] = ran
    return out


def _knob_value(knob: str, value: Any) -> bool:
    """A value of the knob's own type, as a record may hold one (a bool knob's True, an int knob's 2)."""
    default = getattr(TrialConfig(), knob)
    if isinstance(default, bool):
        return isinstance(value, bool)
    return (value is None and default is None) or (isinstance(value, int) and not isinstance(value, bool))


def _count(value: Any) -> bool:
    """A whole number of samples or micro-batches, as a record may hold one."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def loaders_kept(space: SearchSpace, base: TrialConfig, applied: Mapping[str, Any]) -> tuple[SearchSpace, list[str]]:
    """`space` with the loader knobs fixed at the baseline's where every DataLoader trial 0 built loads an
    IterableDataset (its record's `applied`): the trials keep such a loader's own arguments, so searching
    them measures only noise. The knobs it fixed ([] when none)."""
    script = applied.get("script")
    loaders = script.get("loaders") if isinstance(script, Mapping) else None
    if not loaders or not all(x.get("kept") == ITERABLE_KEPT for x in loaders):
        return space, []
    fixed = [k for k in LOADER_KNOBS if k in space.searched()]
    own = baseline_of(base)
    knobs = {**space.knobs, **{k: Fixed(getattr(own, k)) for k in fixed}}
    return SearchSpace(knobs=knobs, source=space.source), fixed


def model_kept(space: SearchSpace, base: TrialConfig, applied: Mapping[str, Any]) -> tuple[SearchSpace, dict[str, str]]:
    """`space` with the knobs an unedited script's model cannot take fixed at the baseline's, from what trial
    0 found of it (its record's `applied.script.model`, trial/loop/script/model.py): several optimizers (no one model,
    nor one for the trial to replicate on several GPUs), or what each model knob's own rule finds missing (its
    `model_why`: no 4-D weights, no repeated blocks); and why, by knob."""
    script = applied.get("script")
    facts = script.get("model") if isinstance(script, Mapping) else None
    if not isinstance(facts, Mapping):
        return space, {}
    routed = {k for k in described.MODEL_NAMES if k in space.searched() and k in facts.get("routed", ())}
    why: dict[str, str] = {}
    if int(facts.get("optimizers") or 0) > 1:
        if facts.get("replicated_by_trial") and "gpus" in space.searched():
            routed.add("gpus")  # the trial would replicate the model: none to replicate
        why = {
            k: f"the script builds {facts['optimizers']} optimizers: no one model is the one it trains" for k in routed
        }
    else:
        for k in described.MODEL:
            if k.NAME in routed and (unfit := getattr(k, "model_why", lambda f: None)(facts)):
                why[k.NAME] = unfit
    if not why:
        return space, {}
    own = baseline_of(base)
    knobs = {**space.knobs, **{k: Fixed(getattr(own, k)) for k in why}}
    return SearchSpace(knobs=knobs, source=space.source), why


def batch_said(line: str) -> bool:
    """A `space:` line about the batch: what a rebase says again."""
    return line.startswith("space: batch_size")
