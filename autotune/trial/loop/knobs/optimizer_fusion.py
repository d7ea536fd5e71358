"""optimizer_fusion's torch side (its story: autotune/core/knobs/optimizer_fusion.py): the optimizer autotune's
own pipelines build (torch's AdamW with the value's flags, or apex's FusedAdam), and the seam that sets the
fused/foreach pair on an unedited script's optimizer before its first step, with the implementation it then
runs read off its param group (`fusion_of`).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, lr_effect
from autotune.core.errors import TrialUnsupported
from autotune.core.knobs.optimizer_fusion import FLAGS, NAME as NAME, WEIGHT_DECAY


def apex_available() -> bool:
    """NVIDIA apex with its CUDA extension built: `apex.optimizers` alone imports without it (a
    Python-only build), and then FusedAdam fails at its first step."""
    try:
        if importlib.util.find_spec("apex.optimizers") is None:
            return False
        importlib.import_module("amp_C")  # the compiled kernels FusedAdam calls
    except (ImportError, ValueError, OSError):  # ValueError: a half-installed package without __spec__
        return False
    return True


def apex_runs_on(device: torch.device) -> bool:
    """apex's FusedAdam is GPU-only: its constructor and kernels need CUDA."""
    return device.type == "cuda"


def build_optimizer(
    params: Iterable[nn.Parameter], cfg: TrialConfig, device: torch.device | None = None
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    params = [p for p in params if p.requires_grad]
    if cfg.optimizer_fusion == "apex":
        if not apex_available():
            raise TrialUnsupported("optimizer_fusion=apex but NVIDIA apex (apex.optimizers) is not installed")
        if device is not None and not apex_runs_on(device):
            raise TrialUnsupported(
                f"optimizer_fusion=apex needs a CUDA device (apex's FusedAdam is GPU-only), not {device}"
            )
        from apex.optimizers import FusedAdam

        # Its zero_grad() takes no argument: set_to_none is given here, as set_grad_none (see zero_grad).
        opt = FusedAdam(
            params, lr=cfg.effective_lr, adam_w_mode=True, weight_decay=WEIGHT_DECAY, set_grad_none=cfg.set_to_none
        )
        return opt, {
            "lr": lr_effect(cfg, cfg.lr, cfg.effective_lr),
            "optimizer_fusion": knob_effect("apex", f"apex.FusedAdam(adam_w_mode=True, weight_decay={WEIGHT_DECAY})"),
        }
    # foreach=False forces the per-parameter for-loop: that is what "none" means.
    kwargs = FLAGS[cfg.optimizer_fusion]
    opt = torch.optim.AdamW(params, lr=cfg.effective_lr, weight_decay=WEIGHT_DECAY, **kwargs)  # type: ignore[arg-type]  # a dict of bools: mypy matches it to betas
    return opt, {
        "lr": lr_effect(cfg, cfg.lr, cfg.effective_lr),
        "optimizer_fusion": knob_effect(
            cfg.optimizer_fusion,
            f"torch.optim.AdamW({next(iter(kwargs))}=True)"
            if cfg.optimizer_fusion != "none"
            else "torch.optim.AdamW(foreach=False)",
        ),
    }


# ---- an unedited script's optimizer (trial/loop/script/seams.py calls these) --------------------------------


def seam(optimizer: torch.optim.Optimizer, value: str) -> None:
    """The fused/foreach pair set on every param group of an optimizer whose groups hold both (torch's, whatever
    its class), before its first step; one without the pair keeps its own implementation. A fused step
    unscales in its kernel: GradScaler hands it the scale."""
    if not {"fused", "foreach"} <= set(optimizer.param_groups[0]):
        return
    for g in optimizer.param_groups:
        g["fused"], g["foreach"] = value == "fused", value == "foreach"
    optimizer._step_supports_amp_scaling = value == "fused"  # type: ignore[attr-defined]


def fusion_of(group: dict[str, Any]) -> str:
    """An optimizer's implementation as its param group's flags say: fused, foreach, the for-loop (none)."""
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "none" if "foreach" in group else "unknown"
