"""channels_last's torch side (its story: autotune/core/knobs/channels_last.py). Autotune's pipelines: the
model converted and each 4-D batch moved in the format (`to_model`, `to_input`). An unedited script: the
weights of the model its optimizer trains in channels_last in place (`Module.to(memory_format=...)` swaps each
parameter's data, so the optimizer holds the same parameters) and every 4-D floating input converted at its
forward pre-hook (`seam`); with at.model() the model handed over is converted (`handed_seen`). Observed: the
memory format of its 4-D weights.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from autotune.core.config import TrialConfig
from autotune.core.knobs.channels_last import NO_CONV, NAME as NAME
from autotune.pipelines.script import api

if TYPE_CHECKING:
    from autotune.trial.loop.script.model import Found


def convolutions(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.dim() == 4]


def to_model(model: torch.nn.Module, cfg: TrialConfig) -> torch.nn.Module:
    # torch's own Module.to: a wrapper that overrides `to` for its device and dtype (timm's training task)
    # may not take a memory format; its children are converted by _apply, whatever they override.
    if cfg.channels_last:
        torch.nn.Module.to(model, memory_format=torch.channels_last)
    return model


def ran(model: torch.nn.Module, cfg: TrialConfig) -> tuple[bool, str]:
    """What autotune's own model showed of it: its 4-D weights in the format (a `seen` pair)."""
    return cfg.channels_last and in_effect(model), ""


def to_input(t: torch.Tensor, device: torch.device, cfg: TrialConfig) -> torch.Tensor:
    """A batch's tensor on the device, 4-D ones in the model's format; non_blocking only overlaps the copy when
    the source is pinned, harmless otherwise."""
    fmt = torch.channels_last if cfg.channels_last and t.dim() == 4 else torch.contiguous_format
    return t.to(device, non_blocking=cfg.pin_memory, memory_format=fmt)


# Under FSDP: not the weights, as fully_shard refuses a non-contiguous parameter (any 4-D weight wider than
# 1x1); to_input still makes the 4-D inputs channels_last, and convolutions given a channels_last input return
# one (cuDNN and oneDNN take the layout from input or weight).
SHARDED = (
    "activations only: FSDP shards contiguous parameters, so the weights stay NCHW; the 4-D inputs are "
    "channels_last and each convolution keeps that layout for its output"
)


def sharded(cfg: TrialConfig) -> tuple[bool, str]:
    """Its effect under FSDP (the model left as it is)."""
    return cfg.channels_last, SHARDED if cfg.channels_last else ""


def inputs(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The forward's arguments with each 4-D floating tensor in channels_last."""
    return tuple(
        a.contiguous(memory_format=torch.channels_last)
        if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point()
        else a
        for a in args
    )


def in_effect(model: torch.nn.Module) -> bool:
    convs = convolutions(model)
    return bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)


# ---- an unedited script's model (trial/loop/script/model.py calls these by the knob list) ----------------


def facts(model: torch.nn.Module) -> dict[str, Any]:
    return {"convolutions": len(convolutions(model))}


def site(model: torch.nn.Module) -> dict[str, Any]:
    return {}


def unfit(model: torch.nn.Module) -> str | None:
    return None if convolutions(model) else NO_CONV


def seam(
    model: torch.nn.Module, cfg: TrialConfig, args: tuple[Any, ...], hooks: list[Any]
) -> tuple[None, tuple[Any, ...]]:
    to_model(model, cfg)
    hooks.append(model.register_forward_pre_hook(lambda m, a: inputs(a)))
    return None, inputs(args)


def seen(found: Found, cfg: TrialConfig, state: None) -> tuple[bool, str]:
    return in_effect(found.model), found.where


def observed(found: Found, state: None) -> dict[str, Any]:
    return {"model_weights_channels_last": in_effect(found.model)}


def handed_seen(trial: api.Trial, final: dict[str, Any], as_written: bool) -> tuple[bool, str]:
    """The memory format of the 4-D weights of the models at.model() got."""
    convs = [p for m in trial.models for p in m.parameters() if p.dim() == 4]
    last = bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    return last, "through at.model()"
