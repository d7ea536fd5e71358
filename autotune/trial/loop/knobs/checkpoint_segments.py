"""checkpoint_segments' torch side (its story: autotune/core/knobs/checkpoint_segments.py). Autotune's
pipelines: the stages they declare wrapped in non-reentrant torch.utils.checkpoint, batch norm's running
statistics kept from the recompute (`wrap_checkpoints`). An unedited script: torch's composable activation checkpointing
(`torch.distributed._composable.checkpoint`, in place: the module keeps its class and its state-dict keys)
on the first k of the model's repeated blocks, its longest ModuleList or Sequential of modules of one
class. Observed: the blocks that carry the checkpoint hooks, and the activation memory they free: the bytes
the model's first forward saved for backward, held (outside the checkpointed blocks) and freed (inside them,
recomputed in backward), counted by saved-tensor hooks (ActivationBytes).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect
from autotune.core.errors import TrialUnsupported
from autotune.core.knobs.checkpoint_segments import NO_BLOCKS, NAME as NAME

if TYPE_CHECKING:
    from autotune.trial.loop.script.model import Found


class CheckpointedStage(torch.nn.Module):
    """Recompute this stage's activations in backward instead of keeping them."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        # Parents may read attributes of the stage they hold (nn.TransformerEncoder reads
        # layers[0].self_attn): the wrapper must stay transparent.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # Non-reentrant: works with kwargs, with DDP, and with inputs that need no grad.
        if torch.compiler.is_compiling():
            # Compiled, the recompute is the partitioner's: it replays pure ops only, and the buffer
            # updates (running stats) stay in the forward graph, once. Dynamo takes no custom context_fn.
            return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, context_fn=self._contexts, **kwargs)

    def _contexts(self) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        return contextlib.nullcontext(), running_stats_kept(self.inner)


_RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


@contextlib.contextmanager
def running_stats_kept(module: torch.nn.Module) -> Iterator[None]:
    """Batch norm's running statistics as they are, whatever runs inside: the checkpoint's recompute is a
    second forward in train mode, which would update them (and num_batches_tracked) twice per step. The
    recompute writes into throwaway copies instead; normalisation uses the batch's own statistics in
    train mode, so its output (and the gradients) are unchanged. The original buffers are put back, not
    overwritten in place: autograd and DDP's buffer broadcast hold references to them."""
    kept: list[tuple[torch.nn.Module, str, torch.Tensor]] = []
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats:
            for name in _RUNNING_STATS:
                buf = m._buffers.get(name)
                if buf is not None:
                    kept.append((m, name, buf))
                    m._buffers[name] = buf.clone()
    try:
        yield
    finally:
        for m, name, buf in kept:
            m._buffers[name] = buf


def wrap_checkpoints(model: torch.nn.Module, stages: Iterable[str], k: int) -> dict[str, Any]:
    """Autotune's pipelines: the first k of the stages the pipeline declares wrapped (CheckpointedStage)."""
    stages = list(stages)
    if k > len(stages):
        raise TrialUnsupported(f"checkpoint_segments={k} but the pipeline declares {len(stages)} stages")
    for name in stages[:k]:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, CheckpointedStage(getattr(parent, attr)))
    return {NAME: knob_effect(k, stages[:k])}


def wrapper_prefixes(model: torch.nn.Module) -> list[str]:
    return [f"{n}.inner." for n, m in model.named_modules() if isinstance(m, CheckpointedStage)]


def on_stages(model: torch.nn.Module, stages: Iterable[str], cfg: TrialConfig) -> dict[str, Any]:
    return wrap_checkpoints(model, stages, cfg.checkpoint_segments)


def refuse_past(cfg: TrialConfig, stages: tuple[str, ...]) -> None:
    """A job that applies the stages itself (a Trainer's): more segments than it declares is exit 5."""
    if cfg.checkpoint_segments > len(stages):
        raise TrialUnsupported(
            f"checkpoint_segments={cfg.checkpoint_segments} but the pipeline declares {len(stages)} stage(s) {list(stages)}"
        )


# ---- an unedited script's model (trial/loop/script/model.py calls these by the knob list) ----------------


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
    from torch.distributed._composable import checkpoint as composable

    chosen = blocks(model)[:segments]
    for block in chosen:
        composable(block)
    return chosen


def facts(model: torch.nn.Module) -> dict[str, Any]:
    found = blocks(model)
    return {"repeated_blocks": len(found), "block": type(found[0]).__name__ if found else None}


def site(model: torch.nn.Module) -> dict[str, Any]:
    """What the diff's lines name: the blocks checkpointed."""
    return {"checkpointed": wrapped(model)}


def unfit(model: torch.nn.Module) -> str | None:
    return None if blocks(model) else NO_BLOCKS


def seam(
    model: torch.nn.Module, cfg: TrialConfig, args: tuple[Any, ...], hooks: list[Any]
) -> tuple[ActivationBytes, tuple[Any, ...]]:
    """The first k blocks checkpointed, and the activation bytes their first forward frees counted."""
    return ActivationBytes(model, apply(model, cfg.checkpoint_segments)), args


def seen(found: Found, cfg: TrialConfig, state: ActivationBytes | None) -> tuple[list[str], str]:
    done = wrapped(found.model)
    said = f"{found.where}: {len(done)} of its {found.facts.get('repeated_blocks')} {found.facts.get('block')} block(s)"
    if state is not None and (counted := state.observed()):
        said += "; " + freed_said(counted)
    return done, said


def observed(found: Found, state: ActivationBytes | None) -> dict[str, Any]:
    out: dict[str, Any] = {"model_checkpointed_blocks": len(wrapped(found.model))}
    if state is not None:
        out["model_activation_bytes"] = state.observed()
    return out


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
