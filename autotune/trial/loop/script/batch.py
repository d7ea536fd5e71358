"""The batch and the lr a trial hands a script: the micro-batch and accumulation (through its DataLoaders,
loader.handed_batch, or at.batch_size() and at.accumulation()), the global batch it plans for, and the lr
scaled for that batch by the study's rule, rescaled where the first step shows another. What ran is
recorded in records.py.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler

from autotune.core.config import TrialConfig, lr_factor
from autotune.pipelines.script import ScriptJob, api, option_lr_factor


# The lr values a param group or a schedule keeps, scaled together when the first step shows the global
# batch the lr was planned for is not the one run (OneCycleLR keeps initial/max/min in the groups).
GROUP_LRS = ("lr", "initial_lr", "max_lr", "min_lr")

SCHEDULE_LRS = ("base_lrs", "_last_lr", "max_lrs")


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
        if job.option_rule is None
        else lambda b, own: option_lr_factor(job.option_rule, b, own),
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
