"""FSDP2 as a strategy (parallel=fsdp): torch's `fully_shard` per block, then on the root.

The order is torch's own (the FSDP2 tutorial, torchtitan): activation checkpointing on each block (the
harness wraps the stages before anything else), then compile per block, then `fully_shard` on each
block, bottom-up, then on the root. Compiling a block before it is sharded keeps FSDP's all-gathers and
reduce-scatters outside the compiled graphs; sharding the root last gives it the parameters no block
holds (embeddings, head) and makes it the module that starts each step's all-gathers.

Every knob is recorded in `applied` as requested / in_effect / why, and what the model really did is
observed on its first step (`applied["fsdp"]`): how many parameters are DTensors, where the shards live,
whether a block's parameters were resharded after forward, the dtype a block computed in, and how many
micro-steps ran with gradient sync off (accumulation) or on.

FSDP2 is imported only when a trial shards: its public API (`torch.distributed.fsdp.fully_shard`) and
`reshard_after_forward=None` (the root keeps its parameters, torch 2.8) are newer than the oldest torch
autotune installs with. There `shard` refuses the knob (exit 5) instead of every trial failing to import.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING, Any
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from autotune.core.config import TrialConfig
from autotune.core.effects import effects, knob_effect
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import knobs
from autotune.trial.measurement import observe

if TYPE_CHECKING:
    from torch.distributed.fsdp import OffloadPolicy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# fully_shard(reshard_after_forward=None), which the root is sharded with: torch 2.8 (earlier releases take
# a bool or an int only, and raise ValueError on None).
MIN_TORCH = (2, 8)
# What each FSDP knob is when it is not in effect (DDP, or one process): the config's defaults.
INERT = {"fsdp_reshard": True, "fsdp_param_dtype": "fp32", "fsdp_reduce_dtype": "fp32", "fsdp_offload": False}


def wanted(cfg: TrialConfig, world: int) -> bool:
    """FSDP needs more than one process to shard over; one process runs the plain model."""
    return cfg.parallel == "fsdp" and world > 1


def inert_effects(cfg: TrialConfig, world: int) -> dict[str, Any]:
    """The strategy knobs of a run that does not shard: DDP, or one process."""
    why = "one process: nothing to replicate or shard" if world == 1 else ""
    out = {"parallel": knob_effect(cfg.parallel, "ddp" if world > 1 else "none", why)}
    for k in INERT:
        out[k] = knob_effect(getattr(cfg, k), None, "parallel is not fsdp" if world > 1 else why)
    return out


def blocks_in_order(model: nn.Module, names: Sequence[str]) -> list[str]:
    """The blocks to shard, deepest first: fully_shard must see a nested block before its parent, which
    then owns only the parameters its sharded children do not."""
    missing = [n for n in names if not _has(model, n)]
    if missing:
        raise TrialUnsupported(f"parallel=fsdp: the pipeline names block(s) the model lacks: {', '.join(missing)}")
    return sorted(names, key=lambda n: -n.count("."))


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def torch_too_old() -> str:
    """Why this torch cannot run parallel=fsdp, or "" when it can. By release (a 2.8 pre-release or vendor
    build, "2.8.0a0+...", is 2.8)."""
    found = re.match(r"(\d+)\.(\d+)", str(torch.__version__))
    if found is not None and (int(found[1]), int(found[2])) < MIN_TORCH:
        return (
            f"parallel=fsdp needs torch >= {'.'.join(map(str, MIN_TORCH))} (fully_shard's "
            f"reshard_after_forward=None); this is torch {torch.__version__}"
        )
    return ""


def shard(
    model: nn.Module, cfg: TrialConfig, device: torch.device, world: int, blocks: Sequence[str]
) -> tuple[nn.Module, dict[str, Any]]:
    """prepare_model's FSDP path: compile (per block) and fully_shard each block, then the root."""
    too_old = torch_too_old()
    if too_old:
        raise TrialUnsupported(too_old)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not blocks:
        raise TrialUnsupported("parallel=fsdp shards per block, but the pipeline names neither `stages` nor `blocks`")
    order = blocks_in_order(model, blocks)
    model = model.to(device)  # FSDP shards what is on the device (or moves shards to the host: offload)
    _same_weights_as_rank0(model)
    # The model knobs before data-parallel as FSDP takes them (the memory format: the inputs only).
    applied = effects(cfg, {k.NAME: k.sharded(cfg) for k in knobs.BEFORE_PARALLEL if hasattr(k, "sharded")})
    mesh = init_device_mesh(device.type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[cfg.fsdp_param_dtype], reduce_dtype=DTYPES[cfg.fsdp_reduce_dtype])
    offload, offload_why = _offload(cfg, device)
    compiled = 0
    for name in order:
        block = model.get_submodule(name)
        if cfg.compile != "off":
            _compile(block, cfg)
            compiled += 1
        fully_shard(block, mesh=mesh, reshard_after_forward=cfg.fsdp_reshard, mp_policy=mp, offload_policy=offload)
    # None: FSDP keeps the root's parameters after forward, as torch advises (backward needs them first).
    fully_shard(model, mesh=mesh, reshard_after_forward=None, mp_policy=mp, offload_policy=offload)
    applied["gpus"] = knob_effect(
        cfg.gpus,
        world,
        f"{world} processes, each holding 1/{world} of the parameters"
        + (" (CPU, over gloo)" if device.type != "cuda" else ""),
    )
    applied["compile"] = knob_effect(cfg.compile, f"{cfg.compile}, per block ({compiled})" if compiled else "off")
    applied["parallel"] = knob_effect("fsdp", f"fully_shard on {len(order)} block(s) then the root")
    applied["fsdp_reshard"] = knob_effect(cfg.fsdp_reshard, cfg.fsdp_reshard, "blocks; the root keeps its parameters")
    applied["fsdp_param_dtype"] = knob_effect(cfg.fsdp_param_dtype, str(mp.param_dtype).removeprefix("torch."))
    applied["fsdp_reduce_dtype"] = knob_effect(cfg.fsdp_reduce_dtype, str(mp.reduce_dtype).removeprefix("torch."))
    applied["fsdp_offload"] = knob_effect(cfg.fsdp_offload, isinstance(offload, CPUOffloadPolicy), offload_why)
    applied["fsdp"] = Probe(model, model.get_submodule(order[0])).seen
    return model, applied


def _same_weights_as_rank0(model: nn.Module) -> None:
    """Each rank built its model from its own seed; DDP broadcasts rank 0's weights when it wraps it, but
    fully_shard keeps each rank's own slice, which would train a model no rank ever built. Rank 0's, as DDP."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)


def _offload(cfg: TrialConfig, device: torch.device) -> tuple[OffloadPolicy, str]:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not cfg.fsdp_offload:
        return OffloadPolicy(), ""
    # Pinned host memory needs CUDA: CPUOffloadPolicy's default pin_memory=True fails without a driver.
    if device.type != "cuda":
        return CPUOffloadPolicy(pin_memory=False), "no CUDA device: the parameters already live in host memory"
    return CPUOffloadPolicy(pin_memory=True), ""


def _compile(block: nn.Module, cfg: TrialConfig) -> None:
    backend = os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor")
    # In place (nn.Module.compile): the block stays the module its parent holds, which fully_shard needs.
    block.compile(backend=backend, mode=cfg.compile if backend == "inductor" else None)


class Probe:
    """What FSDP did on the first step, seen from hooks: `seen` is the live dict `applied` holds."""

    def __init__(self, root: nn.Module, block: nn.Module) -> None:
        from torch.distributed.tensor import DTensor

        params = list(root.parameters())
        local = [p.to_local() for p in params if isinstance(p, DTensor)]
        self.seen: dict[str, Any] = {
            "dtensor_params": len(local),
            "params": len(params),
            "local_numel": sum(t.numel() for t in local),
            "numel": sum(p.numel() for p in params),
            "shard_device": str(local[0].device.type) if local else None,
            "sync_off_micro_steps": 0,
            "sync_on_micro_steps": 0,
        }
        self._block, self._dtensor = block, DTensor
        self._handles = [block.register_forward_hook(self._block_done), root.register_forward_hook(self._root_done)]

    def _block_done(self, module: nn.Module, args: Any, output: Any) -> None:
        if "block_output_dtype" not in self.seen and isinstance(output, torch.Tensor):
            self.seen["block_output_dtype"] = str(output.dtype).removeprefix("torch.")
            if output.dim() == 4:  # an image block: did the memory format reach its activations?
                self.seen["block_output_channels_last"] = observe.nhwc(output)

    def _root_done(self, module: nn.Module, args: Any, output: Any) -> None:
        # By the root's end every block has run its post-forward: True when it resharded its parameters.
        if "resharded_after_forward" not in self.seen:
            self.seen["resharded_after_forward"] = all(isinstance(p, self._dtensor) for p in self._block.parameters())


def is_sharded(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2, which shard() refused
        return False
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """An accumulating micro-step (not the last) keeps its gradients local: DDP's no_sync(), or FSDP2's
    set_requires_gradient_sync(False), its equivalent; the last micro-step reduces the sum."""
    if not is_sharded(model):
        return knobs.no_sync(model, last)
    return _gradient_sync(getattr(model, "_orig_mod", model), last)


@contextlib.contextmanager
def _gradient_sync(model: Any, last: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(last)
    seen = _seen(model)
    if seen is not None:
        seen["sync_on_micro_steps" if last else "sync_off_micro_steps"] += 1
    yield


def _seen(model: nn.Module) -> dict[str, Any] | None:
    for hook in model._forward_hooks.values():
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, Probe):
            return owner.seen
    return None


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights gathered on rank 0, on the host (empty on the other ranks). A collective:
    every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(getattr(model, "_orig_mod", model), options=options)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}  # a model's state: tensors only
