"""The batch and the lr for a script: the micro-batch and accumulation handed over (through its DataLoaders,
loader.handed_batch, or at.batch_size() and at.accumulation()), the global batch its ranks ran, the lr
scaled for it by the study's rule, and the unit the trial's throughput counts.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler

from autotune.core.config import TrialConfig, lr_factor
from autotune.core.effects import Seen, knob_effect, lr_effect
from autotune.pipelines.script import ScriptJob, api, option_lr_factor, option_lr_rule, rule_of
from autotune.trial.loop.script.shown import Shown


# The lr values a param group or a schedule keeps, scaled together when the first step shows the global
# batch the lr was planned for is not the one run (OneCycleLR keeps initial/max/min in the groups).
GROUP_LRS = ("lr", "initial_lr", "max_lr", "min_lr")

SCHEDULE_LRS = ("base_lrs", "_last_lr", "max_lrs")

OWN_SCHEDULE = "the script sets its optimizer's lr itself before its steps (a schedule of its own)"
# A batch nothing in the run showed: recorded as unknown, never as the config's placeholder.
UNSEEN = (
    "not seen: no DataLoader delivered it, none was handed over (at.batch_size()), and its model was never "
    "called with a tensor"
)


def batch_handover(cfg: TrialConfig, job: ScriptJob) -> dict[str, Any]:
    """What the batch seams (its DataLoaders', or at.batch_size() and at.accumulation()) and the lr scale hand
    the script: the config's micro-batch, and its micro-batches per step when the study fixes the global
    batch; nothing for a script whose batch is its own (no DataLoader and no at.batch_size(), or its own
    batch cannot be read yet)."""
    if job.own is None:
        return {}
    fixed = cfg.global_batch is not None

    def scale(own_batch: int, own_accum: int) -> float:
        # The user's lr is meant for the script's own global batch; the trial plans its own (below).
        return lr_factor(planned_global(cfg, own_accum) / (own_batch * own_accum), cfg.lr_scaling)

    return {
        "batch_size": cfg.batch_size,
        "accumulation": cfg.grad_accum if fixed else None,
        "own_batch_size": job.own[0],
        "own_accumulation": job.own[1],
        "through_loader": job.through_loader,
        "batch_option": job.uses.own_value("loader_batch_option") if job.through_loader else job.batch_option,
        "lr_scale": scale,
        "option_lr_scale": None
        if option_lr_rule(job.uses) is None
        else lambda b, own: option_lr_factor(job.uses, b, own),
    }


def planned_global(cfg: TrialConfig, own_accum: int) -> int:
    """The global batch a trial plans for: the study's, else the config's micro-batch x the script's own
    accumulation on each of its ranks (a script that keeps its per-rank batch under torchrun)."""
    return cfg.global_batch_size if cfg.global_batch is not None else cfg.batch_size * cfg.gpus * own_accum


def world_size() -> int:
    """The ranks of the process group the script set up; 1 without one."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def group_lrs(optimizer: torch.optim.Optimizer) -> list[Any]:
    """Each param group's lr as the trial last left it: a float that differs at the next step was set by
    the script."""
    return [group["lr"] for group in optimizer.param_groups]


def rescale_lr(optimizer: torch.optim.Optimizer, schedules: list[LRScheduler], ratio: float) -> None:
    """Every lr the optimizer's groups and its schedules keep, times `ratio` (a schedule computes from its
    base_lrs, or from the group's lr: both move together)."""
    for group in optimizer.param_groups:
        for key in GROUP_LRS:
            value = group.get(key)
            if isinstance(value, torch.Tensor):
                value.mul_(ratio)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                group[key] = value * ratio
    for schedule in schedules:
        for name in SCHEDULE_LRS:
            values = getattr(schedule, name, None)
            if isinstance(values, list):
                setattr(schedule, name, [v * ratio for v in values])


def handed_samples(trial: api.Trial, backwards: int = 0) -> int:
    """Samples per optimizer step where no loader counted any: the micro-batch at.batch_size() handed over
    x the backward passes the step ran (`backwards`, observed: a DDP script that divides its accumulation
    by the world size runs fewer than at.accumulation() handed over), else x the micro-batches per step
    handed over; 1 (steps/s) when the script hands over no batch."""
    got = trial.returned
    if "batch_size" not in got:
        return 1
    return int(got["batch_size"]) * (backwards or int(got.get("accumulation", 1)))


def own_as_run(trial: api.Trial, shown: Shown) -> dict[str, Any] | None:
    """The script's own micro-batch and accumulation as this run handed them over: at.batch_size()'s and
    at.accumulation()'s defaults as the script passed them (a configurator or a config file has set
    them by then), else what its loaders delivered (samples per batch, batches per optimizer step);
    else, with no loader, the batch its model was fed x its backward passes per optimizer step;
    None when none shows one. A script that hands its batch over but accumulates on its own (no
    at.accumulation()) has its accumulation counted from its loaders: the batches per optimizer step."""
    own = trial.defaults
    samples, batches, fed, backwards = shown.samples, shown.batches, shown.fed, shown.backwards
    if "batch_size" in own:
        said = (
            "its DataLoader's batch_size as the run built it"
            if trial.through_loader
            else "at.batch_size()'s default as the run handed it over"
        )
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
    if not samples and fed:
        return {
            "batch_size": fed,
            "accumulation": max(1, backwards),
            "from": f"what its model was fed: {fed} a call, {max(1, backwards)} backward pass(es) per optimizer step",
        }
    if not samples or not batches or samples % batches:
        return None
    return {
        "batch_size": samples // batches,
        "accumulation": batches,
        "from": f"its loaders: {samples} sample(s) in {batches} batch(es) per optimizer step",
    }


def through(trial: api.Trial) -> str:
    """How the trial handed its micro-batch over."""
    if trial.option_words() and not trial.through_loader:
        return f"through its own option {' '.join(trial.option_words())} on its command line, no edit"
    if trial.option_words():
        return f"through its DataLoader's batch_size, given as its own option {' '.join(trial.option_words())}, no edit"
    return "through its DataLoader's batch_size, no edit" if trial.through_loader else "through at.batch_size()"


def seen(shown: Shown, trial: api.Trial) -> Seen:
    """The micro-batch the script ran: its own as its loaders delivered it (or its model was fed), else the one
    handed over, else its first DataLoader's; unknown (None) when none shows one."""
    loader = shown.loaders[0] if shown.loaders else None
    ran = own_as_run(trial, shown)
    if ran is not None and "batch_size" not in trial.returned:  # its own batch, as its loaders delivered it
        return {"batch_size": (ran["batch_size"], f"the script's own batch: {ran['from']}")}
    if "batch_size" in trial.returned:  # handed over (batch_and_lr says more where the study knows its own)
        return {"batch_size": (trial.returned["batch_size"], through(trial))}
    if loader:
        return {"batch_size": (loader["batch_size"], "the script's own DataLoader batch size")}
    return {"batch_size": (None, UNSEEN)}


def batch_and_lr(cfg: TrialConfig, shown: Shown, trial: api.Trial, job: ScriptJob) -> dict[str, Any]:
    """The batch the script ran (handed over, or its own), its accumulation, the global batch its ranks
    ran per step, the lr each optimizer was built with, and the lr rule: the study's, next to the one the
    optimizer that stepped follows."""
    out: dict[str, Any] = {}
    got, own = trial.returned, trial.defaults
    if job.own is not None and "batch_size" in got:
        why = through(trial)
        if own["batch_size"] != job.own[0]:  # the source was read wrong: the baseline is not the script's own
            why += f"; the script's own default is {own['batch_size']}, not the {job.own[0]} its source reads"
        out["batch_size"] = knob_effect(cfg.batch_size, got["batch_size"], why)
    accumulation = got.get("accumulation", own.get("accumulation", job.own[1] if job.own else 1))
    built = shown.built[0] if shown.built else None
    rule = lr_rule_record(cfg, job, shown.stepped[0]["type"] if shown.stepped else None)
    if "lr" in got:
        before, after = own["lr"], got["lr"]
    else:
        before, after = (built["lr"], built["lr_set"]) if built else (None, None)
    if (arithmetic := trial.own_option_factor()) != 1 and before is not None:
        before /= arithmetic  # its own lr, at its own batch: what the study's rule scales from
    own_global = job.own[0] * job.own[1] if job.own else None
    planned = planned_global(cfg, int(own.get("accumulation", job.own[1] if job.own else 1)))
    ran = shown.final.get("global_batch")
    corrected = (built or {}).get("planned_for")
    if own_global is not None and "batch_size" in got and before is not None:
        lr_global = corrected["ran"] if corrected and "lr" not in got else planned
        out["lr"] = lr_effect(cfg, before, after, own_global, global_batch=lr_global)
        out["lr"]["rule"] = rule
        if arithmetic != 1:
            out["lr"]["why"] += (
                f"; its own arithmetic gave {before * arithmetic:.4g} for {' '.join(trial.option_words())} (its lr "
                f"reads the option: x{arithmetic:.4g}), which the trial's factor divides out"
            )
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
        out["global_batch"] = knob_effect(planned, ran, global_why(shown, trial, planned, ran))
    else:
        out["lr"] = knob_effect(before, after, "the script's own lr (its batch is its own)") | {"rule": rule}
        out["global_batch"] = knob_effect(None, ran, global_why(shown, trial, None, ran))
    if built is not None and built.get("own_schedule"):
        out["lr"]["why"] += (
            "; "
            + OWN_SCHEDULE
            + (f": the trial scaled each value it set by {built['factor']:.4g}" if built["factor"] != 1 else "")
        )
    out["script"] = {"accumulation": accumulation, "optimizers_built": list(shown.built)}
    return out


def lr_rule_record(cfg: TrialConfig, job: ScriptJob, stepped: str | None) -> dict[str, Any]:
    """The lr rule the trial scaled by (the study's) and why, beside the optimizer that stepped: where that
    optimizer's family follows another rule (and the script's own lr arithmetic sets none), what to give."""
    rule: dict[str, Any] = {"rule": cfg.lr_scaling, "optimizer": stepped, "why": job.lr_rule_why}
    if cfg.lr_scaling != job.lr_rule:  # the user's --lr-scaling, over the rule read from the source
        rule["why"] = f"--lr-scaling {cfg.lr_scaling}, given (from the source: {job.lr_rule_why})"
    elif stepped is not None and rule_of(stepped) not in (None, cfg.lr_scaling) and not option_lr_rule(job.uses):
        rule["why"] += (
            f"; the optimizer that stepped is {stepped}, whose rule is {rule_of(stepped)}: "
            f"give --lr-scaling {rule_of(stepped)}"
        )
    return rule


def global_why(shown: Shown, trial: api.Trial, planned: int | None, ran: int | None) -> str:
    """What the global batch the ranks ran is made of, and, when it is not the one planned, that the
    script splits its batch over its ranks its own way."""
    world, per_rank = shown.final.get("world_size", 1), shown.final.get("samples_per_step_per_rank")
    said = f"{per_rank} sample(s) per optimizer step on each of {world} rank(s), summed"
    if not shown.samples:
        how = "handed over" if "batch_size" in trial.returned or not shown.fed else "fed to its model"
        said = f"no loader counted: {per_rank} {how} per step on each of {world} rank(s), summed"
    if planned is not None and ran is not None and ran != planned:
        said += (
            f"; the trial planned {planned} (the micro-batch x the accumulation it handed over, on every rank): "
            "the script splits its batch over its ranks its own way"
        )
    return said


def throughput(trial: api.Trial, shown: Shown) -> dict[str, str]:
    """The unit the trial's figure counts: samples when its loaders delivered them or the script handed its
    batch over, else optimizer steps (the figure is then steps/s, and said so)."""
    if shown.samples:
        return {"unit": "samples/s", "why": "the samples its loaders delivered per optimizer step"}
    if "batch_size" in trial.returned:
        return {"unit": "samples/s", "why": "at.batch_size() as handed over x the backward passes of each step"}
    if shown.fed:
        return {"unit": "samples/s", "why": "the batch its model was fed x the backward passes of each step"}
    return {
        "unit": "steps/s",
        "why": "no loader delivered batches and the script hands over no batch (at.batch_size()): optimizer "
        "steps are counted, not samples",
    }
