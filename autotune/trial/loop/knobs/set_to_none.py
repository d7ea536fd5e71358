"""set_to_none's torch side (its story: autotune/core/knobs/set_to_none.py): the zero_grad autotune's pipelines
call, and the seam every zero_grad an unedited script calls goes through.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autotune.core.config import TrialConfig
from autotune.core.knobs.set_to_none import NAME as NAME


def zero_grad(optimizer: torch.optim.Optimizer, cfg: TrialConfig) -> None:
    if cfg.optimizer_fusion != "apex":
        optimizer.zero_grad(set_to_none=cfg.set_to_none)
    elif cfg.set_to_none:
        optimizer.zero_grad()  # apex's own: no argument, it reads set_grad_none
    else:
        # apex's zero_grad() with set_grad_none=False calls torch's Optimizer.zero_grad() with its
        # default, set_to_none=True since torch 2.0: the request would silently not take effect.
        torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)


def seam(original: Callable[..., Any], value: bool | None, calls: list[bool]) -> Callable[..., Any]:
    """zero_grad on an optimizer or a module (`original`: torch's), with the trial's set_to_none (`value`; None:
    each call's own, the script as written); every call's appended to `calls`, whose last the record says."""

    def zero_grad(obj: Any, set_to_none: bool = True) -> None:
        if value is not None:
            set_to_none = value
        calls.append(set_to_none)
        original(obj, set_to_none=set_to_none)

    return zero_grad
