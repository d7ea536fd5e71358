"""The lr values a script's optimizer and its schedules keep, read and rescaled together: the seams set the
lr for the global batch the first step shows, summed over the ranks of the script's process group, where it
is not the one planned (the trial hands its batch over in running.py's batch_handover; records.py records
what ran).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LRScheduler


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
