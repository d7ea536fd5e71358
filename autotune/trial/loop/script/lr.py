"""The lr a script's optimizer trains with in a trial: the values it and its schedules keep, read and rescaled
together; set for the global batch the first step shows, summed over the ranks of the script's process group,
where it is not the one planned; and each value a schedule of the script's own sets, scaled as the built lr
was. The seams call these at the optimizer's step (the trial hands its batch over in running.py's
batch_handover; records.py records what ran).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler

from autotune.core.config import TrialConfig, lr_factor
from autotune.pipelines.script import api


# The lr values a param group or a schedule keeps, scaled together when the first step shows the global
# batch the lr was planned for is not the one run (OneCycleLR keeps initial/max/min in the groups).
GROUP_LRS = ("lr", "initial_lr", "max_lr", "min_lr")

SCHEDULE_LRS = ("base_lrs", "_last_lr", "max_lrs")


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


def scale_own_schedule(optimizer: torch.optim.Optimizer) -> None:
    """A script that sets its optimizer's lr itself between steps (a schedule of its own, as llama2.c's
    get_lr, not a torch LRScheduler built on the scaled lr): each value it sets is meant for its own
    batch, so it gets the trial's factor, as the lr the optimizer was built with did; and it is said."""
    built, before = getattr(optimizer, "_autotune_built", None), getattr(optimizer, "_autotune_lrs", None)
    if built is None or before is None:
        return
    factor = built["factor"]
    for group, lr in zip(optimizer.param_groups, before):
        if isinstance(group["lr"], (int, float)) and not isinstance(group["lr"], bool) and group["lr"] != lr:
            built["own_schedule"] = True
            optimizer._autotune_site["own_schedule"] = True  # type: ignore[attr-defined]
            group["lr"] *= factor


def set_for_the_batch_run(
    optimizer: torch.optim.Optimizer,
    schedules: list[LRScheduler],
    trial: api.Trial,
    cfg: TrialConfig,
    consumed: int,
    own_lr: bool,
) -> None:
    """The lr was scaled at construction for the global batch planned (the handed-over micro-batch x
    accumulation on every rank); the first step shows the one run: the samples a rank `consumed` (0: none
    counted) x the ranks. Where they differ, the lr and the schedules built on it are set for the batch run,
    before the step updates anything; where at.lr() handed the lr already (`own_lr`), it is said, not changed."""
    built = getattr(optimizer, "_autotune_built", None)
    own = trial.own()
    if built is None or own is None or trial.lr_scale is None or not consumed:
        return
    world = world_size()
    planned, runs = cfg.global_batch_with(own[1]), consumed * world
    if world == 1 or runs == planned:  # one process runs the batch handed over
        return
    factor = lr_factor(runs / (own[0] * own[1]), cfg.lr_scaling) / trial.own_option_factor()
    if own_lr:
        built["planned_for"] = {"global_batch": planned, "ran": runs, "rule_factor": factor}
        return
    ratio = factor / built["factor"]
    if ratio != 1:
        rescale_lr(optimizer, schedules, ratio)
    built |= {
        "factor": factor,
        "lr_set": None if built["lr"] is None else built["lr"] * factor,
        "planned_for": {"global_batch": planned, "ran": runs},
    }
