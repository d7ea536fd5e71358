"""channels_last for an unedited script: the model's weights in channels_last, in place
(`Module.to(memory_format=...)` swaps each parameter's data, so the optimizer holds the same parameters),
and every 4-D floating input converted at its forward pre-hook. Observed: the memory format of its 4-D
weights.

With at.model() the trial hands over a model in channels_last instead (`handed_effect`).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.pipelines.script import api


NO_CONV = "the model the optimizer trains has no 4-D (convolution) weights: channels_last changes nothing"


def convolutions(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.dim() == 4]


def apply(model: torch.nn.Module) -> None:
    # torch's own Module.to: a wrapper that overrides `to` for its device and dtype (timm's training task)
    # may not take a memory format; its children are converted by _apply, whatever they override.
    torch.nn.Module.to(model, memory_format=torch.channels_last)


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


def handed_seen(trial: api.Trial) -> tuple[bool, str]:
    """The memory format of the 4-D weights of the models at.model() got."""
    convs = [p for m in trial.models for p in m.parameters() if p.dim() == 4]
    last = bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    return last, "through at.model()"
