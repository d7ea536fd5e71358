"""What the knobs did, seen from inside the worker: effects, not echoes of the config.

`applied` says what each knob was set to; these say what the running trial really did with it, so a
knob that silently did nothing shows (scripts/gpu_check.sh asserts them on a GPU):
  * the dtype of the first conv's output (autocast in effect, fp16/bf16),
  * the memory format of that conv's input and output (channels_last in effect),
  * how often that conv ran in the first optimizer step (`conv_calls`: the micro-batches accumulated
    per step; twice that when the conv's stage is checkpointed, its recompute runs it again),
  * whether the model was compiled, and how many graphs dynamo made,
  * the GradScaler's scale (1.0: the loss is not scaled),
  * the optimizer's own `defaults` (fused, foreach) and its class,
  * whether a batch the loader hands over is in pinned memory, and how many child processes (the
    loader's workers) are alive while it iterates,
  * the process group the ranks really formed (size, backend),
  * on CUDA: this process's pid, and the pids NVML lists as computing on the device it samples.
`cudnn_benchmark` is the flag as torch reads it after the steps (it shows code that reset it, not an
effect: cuDNN keeps its benchmark cache to itself).
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Iterator

import torch
from torch import nn


def is_compiled(model: nn.Module) -> bool:
    # torch.compile's OptimizedModule; under fsdp each block is compiled in place (nn.Module.compile).
    return hasattr(model, "_orig_mod") or any(
        getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()
    )


class FirstConv:
    """A forward hook on the model's first conv, for the steps it is open (one warm-up step: untimed).

    Not on a compiled model: dynamo would trace the hook into the graph. A checkpointed stage runs its
    conv again in backward; the first call is the one recorded, and every call is counted."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[str, Any] = {}
        self._handle: Any = None
        if is_compiled(model):
            return
        conv = next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
        if conv is not None:
            self._handle = conv.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.seen["conv_calls"] = self.seen.get("conv_calls", 0) + 1
        if self.seen["conv_calls"] > 1:
            return
        x = args[0] if args else None
        if isinstance(x, torch.Tensor):
            self.seen["conv_input_channels_last"] = _channels_last(x)
        if isinstance(output, torch.Tensor):
            self.seen["conv_output_dtype"] = str(output.dtype).removeprefix("torch.")
            self.seen["conv_output_channels_last"] = _channels_last(output)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _channels_last(t: torch.Tensor) -> bool:
    # A 1-channel or 1x1 tensor is "contiguous" in both formats: only a real NHWC layout counts.
    return (
        t.dim() == 4
        and t.is_contiguous(memory_format=torch.channels_last)
        and not t.is_contiguous(memory_format=torch.contiguous_format)
    )


def observed(model: nn.Module, device: torch.device, conv: FirstConv, nvml_uuid: str | None = None) -> dict[str, Any]:
    """What the model and this process show: the first conv's record, compilation, cudnn's flag."""
    out: dict[str, Any] = dict(conv.seen)
    out["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    out["compiled"] = is_compiled(model)
    out["compiled_graphs"] = _dynamo_graphs() if out["compiled"] else 0
    if device.type == "cuda":
        out["nvml_uuid"] = nvml_uuid  # which device NVML sampled, for the log
    return out


def after_steps(h: Any, stream: Iterator[Any], conv: FirstConv, util: Any) -> dict[str, Any]:
    """Everything above, once the timed steps are done and while the loader still iterates.

    `h` is the trial's Harness, `stream` its live batch iterator (one more batch is drawn from it, after
    the timing), `util` its measure.GpuUtilSampler (closed: its NVML handle stays valid)."""
    out = observed(h.model, h.device, conv, util.uuid)
    out |= _optimizer(h.optimizer)
    out["grad_scale"] = float(h.precision.scaler.get_scale())
    out |= _process_group()
    out |= _loader(stream)
    if h.device.type == "cuda":
        pids, why = util.compute_pids()
        out["pid"] = os.getpid()
        out["nvml_pids"] = pids
        if why:
            out["nvml_pids_error"] = why
    return out


def _optimizer(opt: torch.optim.Optimizer) -> dict[str, Any]:
    defaults = getattr(opt, "defaults", {}) or {}
    return {
        "optimizer": f"{type(opt).__module__}.{type(opt).__qualname__}",
        "optimizer_fused": defaults.get("fused"),
        "optimizer_foreach": defaults.get("foreach"),
    }


def _process_group() -> dict[str, Any]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"process_group_size": 1, "process_group_backend": None}
    return {"process_group_size": dist.get_world_size(), "process_group_backend": str(dist.get_backend())}


def _loader(stream: Iterator[Any]) -> dict[str, Any]:
    """A batch drawn now, and the child processes alive while the loader iterates (its workers: a trial
    starts no other, except torch.compile's compile workers)."""
    import psutil

    out: dict[str, Any] = {}
    try:
        steps = next(stream)
    except Exception as e:  # an observation must not fail a trial that measured fine
        out["batch_error"] = f"{type(e).__name__}: {e}"
    else:
        tensors = [t for t in _leaves(steps) if isinstance(t, torch.Tensor)]
        out["batch_pinned"] = bool(tensors) and all(t.is_pinned() for t in tensors)
    alive = []
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child.pid)
        except psutil.Error:  # exited meanwhile
            continue
    out["child_processes"] = len(alive)
    return out


def _leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _leaves(item)
    else:
        yield x


def _dynamo_graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: its absence must not fail a trial
        return None
