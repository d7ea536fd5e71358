"""checkpoint_segments for an unedited script: torch's composable activation checkpointing
(`torch.distributed._composable.checkpoint`, in place: the module keeps its class and its state-dict keys)
on the first k of the model's repeated blocks, its longest ModuleList or Sequential of modules of one
class. Observed: the blocks that carry the checkpoint hooks.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import torch


NO_BLOCKS = "the model the optimizer trains has no repeated blocks (no ModuleList or Sequential of like modules)"


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: its longest ModuleList or Sequential whose modules are all of one class
    (at least two); [] when it has none."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            children = list(module.children())
            if len(children) >= 2 and len({type(c) for c in children}) == 1 and len(children) > len(best):
                best = children
    return best


def apply(model: torch.nn.Module, segments: int) -> int:
    """Checkpoint the first `segments` repeated blocks (all of them where it has fewer): how many were."""
    from torch.distributed._composable import checkpoint

    chosen = blocks(model)[:segments]
    for block in chosen:
        checkpoint(block)
    return len(chosen)


def wrapped(model: torch.nn.Module) -> list[str]:
    """The names of the blocks that carry torch's checkpoint hooks (as the other pipelines record them):
    what ran, read from the modules themselves."""
    from torch.distributed._composable.contract import _get_registry

    return [name for name, m in model.named_modules() if name and "checkpoint" in (_get_registry(m) or {})]
