"""What a script trial records of the script's run, read where the seams (autotune.trial.loop.script_seams) saw it:
each routed knob's effect in `applied`'s shape (observed, not the config's echo), the DataLoader and optimizer
construction sites the diff edits, the script's own batch and accumulation as its loaders delivered them,
the global batch and lr it ran, and the unit the trial's throughput counts.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import RandomSampler

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, lr_effect
from autotune.pipelines.script import LOADER_KNOBS, ScriptJob, api, rule_of
from autotune.trial.measurement import observe

if TYPE_CHECKING:
    from autotune.trial.loop.script_seams import Seams

AS_WRITTEN = "the baseline runs the script's own settings"
OWN_SCHEDULE = "the script sets its optimizer's lr itself before its steps (a schedule of its own)"
# A loader `autotune run` left as written: the exported trial never iterated it (Seams.measured).
UNMEASURED = "no trial measured it (the exported trial never iterated it): the script's own"
PRECISION_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def observed(
    cfg: TrialConfig, seams: Seams, trial: api.Trial, as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """What each routed knob did in the script's process, in `applied`'s shape (an unsupported knob keeps
    its record, and why)."""
    why = AS_WRITTEN if as_written else ""
    out: dict[str, Any] = {
        "script": script_record(seams, trial),
        "throughput": throughput(trial, seams.step_samples),
    }
    out["script"] |= amp_record(trial)
    out |= batch_effect(cfg, seams, trial)
    out |= loader_effects(cfg, seams, unsupported, why)
    out |= process_effects(cfg, seams, why)
    out |= model_effects(cfg, trial, seams.final, as_written, unsupported)
    return out


def script_record(seams: Seams, trial: api.Trial) -> dict[str, Any]:
    """What the script ran, as the seams saw it: its loaders and optimizers, its at.* calls, its steps, the
    device, ranks and global batch it ran on, its own batch, its seeds and where its data order came from."""
    seen = seams.final
    return {
        "requested": None,
        "in_effect": None,
        "loaders": seams.loaders,
        "optimizers": seams.optimizers,
        "api_calls": dict(trial.calls),
        "optimizer_steps": seams.hook_steps,
        # the lr each stepped optimizer's first group ran its last step at (after the script's own schedule)
        "lr_last_step": [plain(lrs[0]) for o in seams.stepped if (lrs := getattr(o, "_autotune_lrs", None))],
        "samples_per_step": seams.clock.samples_per_step if seams.clock is not None else None,
        "device": seen.get("device"),
        "world_size": seen.get("world_size"),
        "global_batch": seen.get("global_batch"),
        "batches_per_step": per_step(seams.step_batches) or None,
        "own": own_as_run(trial, seams.step_samples, seams.step_batches),
        "seeded": bool(seams.seeds),
        "seeds": seams.seeds[:3],
        "data_order": data_order(seams, trial),
    }


def amp_record(trial: api.Trial) -> dict[str, Any]:
    """The script's own AMP: what at.autocast() entered (and an autocast of the script's around it), and
    whether at.scaler()'s GradScaler scaled."""
    out: dict[str, Any] = {}
    if "autocast" in trial.calls:
        out["autocast"] = dict(trial.autocasts)
        if trial.outer_autocast is not None:
            out["outer_autocast"] = trial.outer_autocast
    if trial.scalers:
        scaling = [s for s in trial.scalers if observe.scaled(s)]
        out["grad_scaler"] = {"enabled": trial.scalers[0].is_enabled(), "scaled": bool(scaling)}
    return out


def batch_effect(cfg: TrialConfig, seams: Seams, trial: api.Trial) -> dict[str, Any]:
    """The micro-batch the script ran: its own as its loaders delivered it, else the one handed over, else
    its first DataLoader's; nothing when none shows one."""
    loader = seams.loaders[0] if seams.loaders else None
    ran = own_as_run(trial, seams.step_samples, seams.step_batches)
    if ran is not None and "batch_size" not in trial.returned:  # its own batch, as its loaders delivered it
        return {"batch_size": knob_effect(cfg.batch_size, ran["batch_size"], f"the script's own batch: {ran['from']}")}
    if "batch_size" in trial.returned:  # handed over (batch_and_lr says more where the study knows its own)
        return {"batch_size": knob_effect(cfg.batch_size, trial.returned["batch_size"], "through at.batch_size()")}
    if loader:
        return {
            "batch_size": knob_effect(cfg.batch_size, loader["batch_size"], "the script's own DataLoader batch size")
        }
    return {}


def loader_effects(cfg: TrialConfig, seams: Seams, unsupported: frozenset[str], why: str) -> dict[str, Any]:
    """Each supported DataLoader knob as the script's first loader it was applied to ran it (`autotune run`
    leaves the loaders no trial measured as written), else its first."""
    loader = next(
        (x for x in seams.loaders if x.get("kept") != UNMEASURED), seams.loaders[0] if seams.loaders else None
    )
    out: dict[str, Any] = {}
    for k in LOADER_KNOBS:
        if k in unsupported:
            continue
        out[k] = (
            knob_effect(getattr(cfg, k), loader[k], loader.get("kept", why))
            if loader
            else knob_effect(getattr(cfg, k), None, "the script built no DataLoader in this run")
        )
    return out


def process_effects(cfg: TrialConfig, seams: Seams, why: str) -> dict[str, Any]:
    """The optimizer's fusion as its first step ran it, zero_grad's set_to_none as last called, and the
    process's cudnn.benchmark and thread count."""
    out: dict[str, Any] = {}
    if seams.optimizers:
        out["optimizer_fusion"] = knob_effect(cfg.optimizer_fusion, seams.optimizers[0]["fusion"], why)
    if seams.zero_grads:
        out["set_to_none"] = knob_effect(cfg.set_to_none, seams.zero_grads[-1], why)
    out["cudnn_benchmark"] = knob_effect(cfg.cudnn_benchmark, torch.backends.cudnn.benchmark, why)
    out["num_threads"] = knob_effect(cfg.num_threads, torch.get_num_threads(), why or "0 = torch default")
    return out


def model_effects(
    cfg: TrialConfig, trial: api.Trial, seen: dict[str, Any], as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """The precision the model ran at, the ranks, and the memory format and compilation of the model
    at.model() got."""
    out: dict[str, Any] = {}
    if "autocast" in trial.calls:
        out["precision"] = precision_effect(cfg, trial, seen, as_written)
    if "gpus" not in unsupported:
        out["gpus"] = knob_effect(cfg.gpus, seen.get("world_size"), "the ranks of the script's own process group")
    if "model" in trial.calls:
        convs = [p for m in trial.models for p in m.parameters() if p.dim() == 4]
        last = bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
        out["channels_last"] = knob_effect(cfg.channels_last, last, "through at.model()")
        out["compile"] = compile_effect(cfg, trial, seen)
    return out


def precision_effect(cfg: TrialConfig, trial: api.Trial, seen: dict[str, Any], as_written: bool) -> dict[str, Any]:
    """The precision the model ran at, as its forward showed it (the output dtype of its first layer, else
    its own): not the config's echo. Without a model handed to at.model() (or one the trial compiled), what
    at.autocast() entered, on the device the script's tensors live on."""
    own = trial.defaults.get("precision", "fp32")
    entered = sorted(trial.autocasts, key=lambda k: -trial.autocasts[k])
    said = [f"at.autocast() ran {', '.join(f'{k} x{trial.autocasts[k]}' for k in entered)}"]
    dtype = seen.get("first_layer_output_dtype") or seen.get("output_dtype")
    if dtype is not None:
        in_effect = PRECISION_OF_DTYPE.get(dtype, dtype)
        where = "its first layer's" if seen.get("first_layer_output_dtype") else "its"
        said.append(f"the model at.model() got returned {dtype} ({where} output)")
    else:
        in_effect = entered[0].split(" on ")[0] if entered else own
        said.append("its model's output was not watched (none handed to at.model(), or compiled)")
    outer = trial.outer_autocast
    if outer is not None:
        said.append(
            f"the script's own autocast({outer['device_type']}, {outer['dtype']}) encloses at.autocast(): "
            + (
                "the baseline keeps it, as the script runs alone"
                if as_written
                else "the trial's precision replaced it inside at.autocast() only; give its dtype to "
                "at.autocast() (at.autocast(torch.bfloat16)) in its place"
            )
        )
    if as_written:
        said.append(f"{AS_WRITTEN}: at.autocast({own!r})")
    return knob_effect(cfg.precision, in_effect, "; ".join(said))


def compile_effect(cfg: TrialConfig, trial: api.Trial, seen: dict[str, Any]) -> dict[str, Any]:
    """Whether the model the script ran was compiled: at.model() returned a compiled module, and dynamo
    compiled graphs while the script ran (a script that keeps the module it passed, not the one returned,
    runs eagerly)."""
    if not any(observe.is_compiled(m) for m in trial.handed_back):
        return knob_effect(cfg.compile, "off", "through at.model(): the model it returned is not compiled")
    graphs = seen.get("compiled_graphs")
    if graphs == 0:
        return knob_effect(
            cfg.compile,
            "off",
            "at.model() returned a compiled model, but dynamo compiled no graph while the script ran: it runs "
            "the module it passed, not the one at.model() returned",
        )
    mode = cfg.compile if cfg.compile != "off" else "the script's own torch.compile"
    return knob_effect(cfg.compile, mode, f"through at.model(): {graphs} graph(s) compiled" if graphs else "")


def batch_and_lr(cfg: TrialConfig, seams: Seams, trial: api.Trial, job: ScriptJob) -> dict[str, Any]:
    """The batch the script ran (handed over, or its own), its accumulation, the global batch its ranks
    ran per step, the lr each optimizer was built with, and the lr rule: the study's, next to the one the
    optimizer that stepped follows."""
    out: dict[str, Any] = {}
    got, own = trial.returned, trial.defaults
    if job.own is not None and "batch_size" in got:
        why = "through at.batch_size()"
        if own["batch_size"] != job.own[0]:  # the source was read wrong: the baseline is not the script's own
            why += f"; the script's own default is {own['batch_size']}, not the {job.own[0]} its source reads"
        out["batch_size"] = knob_effect(cfg.batch_size, got["batch_size"], why)
    accumulation = got.get("accumulation", own.get("accumulation", job.own[1] if job.own else 1))
    built = seams.constructed[0] if seams.constructed else None
    stepped = seams.optimizers[0]["type"] if seams.optimizers else None
    rule: dict[str, Any] = {"rule": cfg.lr_scaling, "optimizer": stepped, "why": job.lr_rule_why}
    if cfg.lr_scaling != job.lr_rule:  # the user's --lr-scaling, over the rule read from the source
        rule["why"] = f"--lr-scaling {cfg.lr_scaling}, given (from the source: {job.lr_rule_why})"
    elif stepped is not None and rule_of(stepped) not in (None, cfg.lr_scaling):
        rule["why"] += (
            f"; the optimizer that stepped is {stepped}, whose rule is {rule_of(stepped)}: "
            f"give --lr-scaling {rule_of(stepped)}"
        )
    if "lr" in got:
        before, after = own["lr"], got["lr"]
    else:
        before, after = (built["lr"], built["lr_set"]) if built else (None, None)
    own_global = job.own[0] * job.own[1] if job.own else None
    planned = planned_global(cfg, int(own.get("accumulation", job.own[1] if job.own else 1)))
    ran = seams.final.get("global_batch")
    corrected = (built or {}).get("planned_for")
    if own_global is not None and "batch_size" in got and before is not None:
        lr_global = corrected["ran"] if corrected and "lr" not in got else planned
        out["lr"] = lr_effect(cfg.replace(batch_size=lr_global, gpus=1, global_batch=None), before, after, own_global)
        out["lr"]["rule"] = rule
        if corrected:
            out["lr"]["why"] += (
                f"; planned for global batch {corrected['global_batch']}, the ranks ran {corrected['ran']}"
                + (
                    f": at.lr() had handed the lr for {corrected['global_batch']} (the rule's factor for "
                    f"{corrected['ran']} is {corrected['rule_factor']:.4g})"
                    if "lr" in got
                    else ": set for the batch run before the first step"
                )
            )
        out["global_batch"] = knob_effect(planned, ran, global_why(seams, planned, ran))
    else:
        out["lr"] = knob_effect(before, after, "the script's own lr (its batch is its own)") | {"rule": rule}
        out["global_batch"] = knob_effect(None, ran, global_why(seams, None, ran))
    if built is not None and built.get("own_schedule"):
        out["lr"]["why"] += (
            "; "
            + OWN_SCHEDULE
            + (f": the trial scaled each value it set by {built['factor']:.4g}" if built["factor"] != 1 else "")
        )
    out["script"] = {"accumulation": accumulation, "optimizers_built": seams.constructed}
    return out


def global_why(seams: Seams, planned: int | None, ran: int | None) -> str:
    """What the global batch the ranks ran is made of, and, when it is not the one planned, that the
    script splits its batch over its ranks its own way."""
    seen = seams.final
    world, per_rank = seen.get("world_size", 1), seen.get("samples_per_step_per_rank")
    said = f"{per_rank} sample(s) per optimizer step on each of {world} rank(s), summed"
    if not per_step(seams.step_samples):
        said = f"no loader counted: {per_rank} handed over per step on each of {world} rank(s), summed"
    if planned is not None and ran is not None and ran != planned:
        said += (
            f"; the trial planned {planned} (the micro-batch x the accumulation it handed over, on every rank): "
            "the script splits its batch over its ranks its own way"
        )
    return said


def data_order(seams: Seams, trial: api.Trial) -> str | None:
    """Where the trial's data seed reached the data this run trained on: at.data_seed() (a script that draws
    its batches itself), or a DataLoader that shuffles by its generator; None: nowhere, so parity's data-order
    twin would train on the baseline's own batches."""
    if "data_seed" in trial.calls:
        return "at.data_seed()"
    if any(seams.shuffles.values()):
        return "a DataLoader that shuffles (the trial seeds its generator)"
    return None


def record_site(
    sites: dict[str, list[dict[str, Any]]], kind: str, obj: Any, own: dict[str, Any], ran: Any, **used: bool
) -> dict[str, Any]:
    """The record, in `sites[kind]`, of the user's call that built `obj` (one per call, however often it runs:
    a loader built each epoch is one site, iterated if any of its loaders was)."""
    where = call_site()
    for site in sites[kind]:
        if all(site.get(k) == v for k, v in where.items()):
            return site
    site = where | {"type": type(obj).__name__, "own": plain(own), "ran": plain(ran), **used}
    sites[kind].append(site)
    return site


def call_site() -> dict[str, Any]:
    """The user's call that is constructing a DataLoader or optimizer: the first frame out of torch and
    autotune (a subclass's own __init__ is the user's), its file and line, and the call's columns where
    Python says them (3.11+: the instruction's position)."""
    inside = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (torch, sys.modules["autotune"]))
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame = frame.f_back
    where: dict[str, Any] = {"file": os.path.abspath(frame.f_code.co_filename), "line": frame.f_lineno}
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None:
        line, end_line, col, end_col = list(positions())[frame.f_lasti // 2]
        if line == frame.f_lineno and None not in (end_line, col, end_col):
            where |= {"col": col, "end_line": end_line, "end_col": end_col}
    return where


def plain(value: Any) -> Any:
    """A recorded argument as the study stores it (JSON): a number, a word or None, else its repr."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def fusion_of(group: dict[str, Any]) -> str:
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "none" if "foreach" in group else "unknown"


def own_as_run(trial: api.Trial, step_samples: list[int], step_batches: list[int]) -> dict[str, Any] | None:
    """The script's own micro-batch and accumulation as this run handed them over: at.batch_size()'s and
    at.accumulation()'s defaults as the script passed them (a configurator or a config file has set
    them by then), else what its loaders delivered (samples per batch, batches per optimizer step);
    None when neither shows one. A script that hands its batch over but accumulates on its own (no
    at.accumulation()) has its accumulation counted from its loaders: the batches per optimizer step."""
    own = trial.defaults
    samples, batches = per_step(step_samples), per_step(step_batches)
    if "batch_size" in own:
        said = "at.batch_size()'s default as the run handed it over"
        if "accumulation" in own:
            accumulation, said = (
                int(own["accumulation"]),
                "at.batch_size()'s and at.accumulation()'s defaults as the run handed them over",
            )
        elif batches:
            accumulation = batches
            said += f"; the accumulation: its loaders' {batches} batch(es) per optimizer step"
        else:
            accumulation = trial.own_accumulation
        return {"batch_size": int(own["batch_size"]), "accumulation": accumulation, "from": said}
    if not samples or not batches or samples % batches:
        return None
    return {
        "batch_size": samples // batches,
        "accumulation": batches,
        "from": f"its loaders: {samples} sample(s) in {batches} batch(es) per optimizer step",
    }


def throughput(trial: api.Trial, step_samples: list[int]) -> dict[str, str]:
    """The unit the trial's figure counts: samples when its loaders delivered them or the script handed its
    batch over, else optimizer steps (the figure is then steps/s, and said so)."""
    if per_step(step_samples):
        return {"unit": "samples/s", "why": "the samples its loaders delivered per optimizer step"}
    if "batch_size" in trial.returned:
        return {"unit": "samples/s", "why": "at.batch_size() as handed over x the backward passes of each step"}
    return {
        "unit": "steps/s",
        "why": "no loader delivered batches and the script hands over no batch (at.batch_size()): optimizer "
        "steps are counted, not samples",
    }


def handed_samples(trial: api.Trial, backwards: int = 0) -> int:
    """Samples per optimizer step where no loader counted any: the micro-batch at.batch_size() handed over
    x the backward passes the step ran (`backwards`, observed: a DDP script that divides its accumulation
    by the world size runs fewer than at.accumulation() handed over), else x the micro-batches per step
    handed over; 1 (steps/s) when the script hands over no batch."""
    got = trial.returned
    if "batch_size" not in got:
        return 1
    return int(got["batch_size"]) * (backwards or int(got.get("accumulation", 1)))


def per_step(samples: list[int]) -> int:
    """The samples a rank's loaders delivered per optimizer step: the most common count (an epoch's last,
    smaller batch aside); 0 when no loader delivered any."""
    counted = collections.Counter(n for n in samples if n)
    return counted.most_common(1)[0][0] if counted else 0


def planned_global(cfg: TrialConfig, own_accum: int) -> int:
    """The global batch a trial plans for: the study's, else the config's micro-batch x the script's own
    accumulation on each of its ranks (a script that keeps its per-rank batch under torchrun)."""
    return cfg.global_batch_size if cfg.global_batch is not None else cfg.batch_size * cfg.gpus * own_accum


def shuffled(it: Any) -> bool:
    """Whether a DataLoader iterator draws its order from the loader's generator (a RandomSampler, the one
    the trial seeds with the data seed); a sequential or distributed sampler keeps its own order."""
    sampler = getattr(it, "_index_sampler", None)
    sampler = getattr(sampler, "sampler", sampler)
    return isinstance(sampler, RandomSampler)


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (tuples, lists, dicts); 1 without one."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_len(item)
        if n:
            return n
    return 1
