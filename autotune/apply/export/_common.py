"""What every framework rendering shares: the per-knob table of where each tuned knob goes, the optimizer
the trials built, and the DataLoader arguments."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from autotune.core.config import KNOBS, TrialConfig


def knob_table(cfg: TrialConfig, where: Mapping[str, str]) -> str:
    """One comment line per knob, in KNOBS order. A knob missing from `where` is a KeyError, on purpose:
    a new knob must be given a place in every target rather than vanish from it."""
    width = max(len(k) for k in KNOBS)
    rows = [f"#   {k:<{width}} = {_show(getattr(cfg, k)):<12} -> {where[k]}" for k in KNOBS]
    return "\n".join(rows)


def _show(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


_ADAMW_KW = {"none": "foreach=False", "foreach": "foreach=True", "fused": "fused=True"}

# The trials' weight decay (autotune.trial.knobs.WEIGHT_DECAY, torch AdamW's default), written out in
# every export: a framework whose default differs (HF's is 0) must still train what was measured.
# Not imported from there: that module imports torch, and `autotune export` should not.
WEIGHT_DECAY = 0.01


def accelerator(device: str | None) -> str:
    """A trial records "cpu", or the GPU's name ("NVIDIA H200"): anything but cpu was measured on a GPU."""
    if not device:
        return "auto"
    return "cpu" if device.startswith("cpu") else "gpu"


def optimizer_expr(cfg: TrialConfig, params: str) -> str:
    if cfg.optimizer_fusion == "apex":
        # apex's weight decay defaults to 0 and its zero_grad() takes no set_to_none: both go here.
        return (
            f"apex.optimizers.FusedAdam({params}, lr={cfg.effective_lr!r}, adam_w_mode=True, "
            f"weight_decay={WEIGHT_DECAY}, set_grad_none={cfg.set_to_none!r})"
        )
    return (
        f"torch.optim.AdamW({params}, lr={cfg.effective_lr!r}, weight_decay={WEIGHT_DECAY}, "
        f"{_ADAMW_KW[cfg.optimizer_fusion]})"
    )


def loader_kwargs(cfg: TrialConfig, indent: str = "    ") -> list[str]:
    """The DataLoader keyword arguments, one per line: Lightning's dataloader_kwargs and accelerate's script."""
    return [
        f"{indent}batch_size={cfg.batch_size!r},  # per process",
        f"{indent}num_workers={cfg.num_workers!r},",
        f"{indent}pin_memory={cfg.pin_memory!r},",
        f"{indent}persistent_workers={cfg.persistent_workers!r},",
        f"{indent}prefetch_factor={cfg.prefetch_factor!r},",
    ]


def training_lines(cfg: TrialConfig) -> list[str]:
    """Comment lines: the optimizer step this config computes (global batch, accumulation, lr and its rule)."""
    lines = [
        f"# global batch {cfg.global_batch_size} = {cfg.batch_size} per process x {cfg.gpus} process(es) x "
        f"{cfg.grad_accum} accumulation step(s)"
    ]
    if cfg.effective_lr != cfg.lr:
        lines.append(
            f"# lr {cfg.effective_lr:.6g}: {cfg.lr:g} for global batch {cfg.reference_batch}, scaled by the "
            f"{cfg.lr_scaling} rule for {cfg.global_batch_size}"
        )
    else:
        lines.append(
            f"# lr {cfg.effective_lr:g}: the learning rate autotune trained with (global batch {cfg.global_batch_size})"
        )
    return lines


def zero_grad_call(cfg: TrialConfig) -> str:
    """apex's FusedAdam.zero_grad() takes no arguments (set_grad_none was given to its constructor)."""
    if cfg.optimizer_fusion == "apex":
        return (
            "optimizer.zero_grad()"
            if cfg.set_to_none
            else "torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)"
        )
    return f"optimizer.zero_grad(set_to_none={cfg.set_to_none!r})"
