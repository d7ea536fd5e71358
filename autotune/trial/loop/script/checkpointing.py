"""checkpoint_segments for an unedited script: torch's composable activation checkpointing
(`torch.distributed._composable.checkpoint`, in place: the module keeps its class and its state-dict keys)
on the first k of the model's repeated blocks, its longest ModuleList or Sequential of modules of one
class. Observed: the blocks that carry the checkpoint hooks, and the activation memory they free: the bytes
the model's first forward saved for backward, held (outside the checkpointed blocks) and freed (inside them,
recomputed in backward), counted by saved-tensor hooks (ActivationBytes).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks


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


def apply(model: torch.nn.Module, segments: int) -> list[torch.nn.Module]:
    """Checkpoint the first `segments` repeated blocks (all of them where it has fewer): those that were."""
    from torch.distributed._composable import checkpoint

    chosen = blocks(model)[:segments]
    for block in chosen:
        checkpoint(block)
    return chosen


def wrapped(model: torch.nn.Module) -> list[str]:
    """The names of the blocks that carry torch's checkpoint hooks (as the other pipelines record them):
    what ran, read from the modules themselves."""
    from torch.distributed._composable.contract import _get_registry

    return [name for name, m in model.named_modules() if name and "checkpoint" in (_get_registry(m) or {})]


class ActivationBytes:
    """The bytes the model's first forward saves for backward, by distinct storage (parameters aside): `held`,
    kept until backward, and `freed`, saved inside the checkpointed blocks, where checkpointing's own hook
    drops them and backward recomputes them (its peak then holds one block's). The model's forward runs
    under a counting hook that keeps each tensor; each checkpointed block's, under one that counts and then
    hands the tensor to checkpointing's hook (the innermost pair is the one autograd calls). Then removed:
    only the first forward pays for the counting."""

    def __init__(self, model: torch.nn.Module, checkpointed: list[torch.nn.Module]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.bytes = {"held": 0, "freed": 0}
        self.measured: bool | None = None  # whether the first forward ran with grad: read as it ends
        self.outer = saved_tensors_hooks(lambda t: self._count("held", t), lambda t: t)
        self.inner: list[saved_tensors_hooks] = []
        self.handles = [model.register_forward_hook(self._done, always_call=True)]
        for block in checkpointed:  # after checkpointing's hooks: its context entered first, left last
            self.handles.append(block.register_forward_pre_hook(self._enter))
            self.handles.append(block.register_forward_hook(self._leave, prepend=True, always_call=True))
        self.outer.__enter__()

    def _count(self, kind: str, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr or ptr in self.params:
            return t
        known = self.storages.get(ptr)
        # A freed activation's address is reused within the same forward: the same address is the same storage
        # only while that storage lives (torch keeps one Python object per live storage, so a weak reference
        # to it dies with it).
        if known is None or known() is not storage:
            self.storages[ptr] = weakref.ref(storage)
            self.bytes[kind] += storage.nbytes()
        return t

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)  # checkpointing's pair
        if top is None:  # checkpointing did not run here: nothing is freed
            self.inner.append(saved_tensors_hooks(lambda t: self._count("held", t), lambda t: t))
        else:
            pack, unpack = top
            self.inner.append(saved_tensors_hooks(lambda t: pack(self._count("freed", t)), unpack))
        self.inner[-1].__enter__()

    def _leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.inner.pop().__exit__(None, None, None)

    def _done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.measured = torch.is_grad_enabled()
        self.outer.__exit__(None, None, None)
        for handle in self.handles:
            handle.remove()

    def observed(self) -> dict[str, int] | None:
        """{held, freed} in bytes, at the trial's micro-batch; None where the first forward saved nothing for
        backward (run without grad), or has not ended."""
        return dict(self.bytes) if self.measured else None


def freed_said(counted: dict[str, int]) -> str:
    """The activation memory checkpointing freed, in words."""
    total = counted["held"] + counted["freed"]
    share = f" ({100 * counted['freed'] / total:.0f}% of them)" if total else ""
    return (
        f"{counted['freed'] / 2**20:.3g} MiB of the activations its first forward saved for backward freed{share}, "
        f"{counted['held'] / 2**20:.3g} MiB held"
    )
