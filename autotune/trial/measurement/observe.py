"""What the knobs did, seen from inside the worker: effects, not echoes of the config.

`applied` says what each knob was set to; these say what the running trial really did with it, so a
knob that silently did nothing shows (scripts/gpu_check.sh asserts them on a GPU):
  * the dtype of the first conv's output (autocast in effect, fp16/bf16),
  * the memory format of that conv's input and output (channels_last in effect),
  * how often that conv ran in the first optimizer step (`conv_calls`: the micro-batches accumulated
    per step; twice that when the conv's stage is checkpointed, its recompute runs it again),
  * whether the model was compiled, and how many graphs dynamo made,
  * the GradScaler's scale, and whether it ever scaled a loss (`grad_scaler_scaled`: a disabled scaler's
    get_scale() is the constant 1.0, which says nothing; an enabled one makes its scale tensor on its first
    scale()),
  * the optimizer's class and own flags (fused, foreach: its first param group's), and where it keeps
    its step count (`optimizer_step_device`: the fused Adam/AdamW kernels keep `state["step"]` on the
    parameters' device, the for-loop and foreach ones a CPU tensor: the fused kernel's effect, not the
    flag it was built with),
  * whether a batch the loader hands over is in pinned memory, and how many child processes (the
    loader's workers) are alive while it iterates,
  * the process group the ranks really formed (size, backend),
  * on CUDA: this process's pid, the pid NVML knows it by (the host's: another in a container's own pid
    namespace, or unknown there, said), and the pids NVML lists as computing on the device it samples.
`cudnn_benchmark` is the flag as torch reads it after the steps (it shows code that reset it, not an
effect: cuDNN keeps its benchmark cache to itself).

A job that owns its loop (a user's script, a Lightning or transformers Trainer) has no first conv of
autotune's to watch: `OutputDtype` hooks the module the job hands over (the model a script passes to
at.model(), a Trainer model's first layer: `first_layer`), and `in_job` reads the rest from the job's own
objects (its parameters' device, its optimizer, its process group, NVML's pids).
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Iterator

import torch
from torch import nn

from autotune.core import knobs
from autotune.trial.measurement.measure import nvml_pid


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
            self.seen["conv_input_channels_last"] = nhwc(x)
        if isinstance(output, torch.Tensor):
            self.seen["conv_output_dtype"] = str(output.dtype).removeprefix("torch.")
            self.seen["conv_output_channels_last"] = nhwc(output)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def nhwc(t: torch.Tensor) -> bool:
    # A 1-channel or 1x1 tensor is "contiguous" in both formats: only a real NHWC layout counts.
    return (
        t.dim() == 4
        and t.is_contiguous(memory_format=torch.channels_last)
        and not t.is_contiguous(memory_format=torch.contiguous_format)
    )


def observed(model: nn.Module, device: torch.device, conv: FirstConv, nvml_uuid: str | None = None) -> dict[str, Any]:
    """What the model and this process show: the first conv's record, compilation, the process flags."""
    out: dict[str, Any] = dict(conv.seen)
    out |= flags()
    out["compiled"] = is_compiled(model)
    out["compiled_graphs"] = dynamo_graphs() if out["compiled"] else 0
    if out["compiled"]:
        out["cudagraph_skips"] = cudagraph_skips()
    if device.type == "cuda":
        out["nvml_uuid"] = nvml_uuid  # which device NVML sampled, for the log
    return out


def after_steps(h: Any, stream: Iterator[Any], conv: FirstConv, util: Any) -> dict[str, Any]:
    """Everything above, once the timed steps are done and while the loader still iterates.

    `h` is the trial's Harness, `stream` its live batch iterator (one more batch is drawn from it, after
    the timing), `util` its measure.GpuUtilSampler (closed: its NVML handle stays valid)."""
    out = observed(h.model, h.device, conv, util.uuid)
    out |= _optimizer(h.optimizer) | optimizer_state(h.optimizer)
    out["grad_scale"] = float(h.precision.scaler.get_scale())
    out["grad_scaler_scaled"] = scaled(h.precision.scaler)
    out |= _process_group()
    out |= _loader(stream)
    if h.device.type == "cuda":
        out |= nvml_pids(util)
    return out


def in_job(model: nn.Module | None, optimizer: Any, device: torch.device, util: Any) -> dict[str, Any]:
    """What a job that owns its loop showed, read from its own objects after the steps: its parameters'
    device, its optimizer's defaults and where that keeps its step count, the process group it formed,
    and on CUDA this process's pid among those NVML lists (`util`: the Clock's sampler, or None)."""
    out: dict[str, Any] = {"param_device": param_device(model) if model is not None else None}
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's
    if isinstance(inner, torch.optim.Optimizer):
        out |= _optimizer(inner) | optimizer_state(inner)
    out |= _process_group() | flags()
    if device.type == "cuda" and util is not None:
        out |= nvml_pids(util)
    return out


def nvml_pids(util: Any) -> dict[str, Any]:
    """This process's pid and the pids NVML lists computing on the device `util` samples; `nvml_pid`, this
    process as NVML names it (the host's pid: another in a container's own pid namespace), to look for among
    them, and where it cannot be known (None), `pid_namespace` says why."""
    pids, why = util.compute_pids()
    mine, unknown = nvml_pid()
    out: dict[str, Any] = {"pid": os.getpid(), "nvml_pid": mine, "nvml_pids": pids}
    if why:
        out["nvml_pids_error"] = why
    if unknown:
        out["pid_namespace"] = unknown
    return out


class OutputDtype:
    """A forward hook on a module the job hands over: the dtype of the first floating-point tensor its first
    call returned (`output_dtype`, with `output_of` naming the module), so autocast shows whoever entered
    it (a script's at.autocast(), a Trainer's precision plugin), then the hook removes itself. None: no
    module to watch. Not on a compiled one (dynamo would trace the hook into its graph): a caller whose
    module runs inside a compiled wrapper passes None."""

    def __init__(self, module: nn.Module | None, where: str) -> None:
        self.seen: dict[str, Any] = {}
        self._handle: Any = None
        if module is not None and not is_compiled(module):
            self._where = where
            self._handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        dtype = next((t.dtype for t in _leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if dtype is not None:
            self.seen = {"output_dtype": str(dtype).removeprefix("torch."), "output_of": self._where}
            self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def first_layer(model: nn.Module) -> tuple[nn.Module | None, str]:
    """The model's first Linear or convolution and its name: where a Trainer's autocast shows (the model's
    own output may be cast back to float32, as accelerate does under mixed precision)."""
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
            return m, f"{name} ({type(m).__name__})"
    return None, ""


def param_device(model: nn.Module) -> str | None:
    p = next(model.parameters(), None)
    return None if p is None else str(p.device)


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The device of the optimizer's first `state["step"]` tensor (None before a step, or an optimizer that
    keeps no step count, such as SGD)."""
    for state in opt.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            return {"optimizer_step_device": str(step.device)}
    return {"optimizer_step_device": None}


def scaled(scaler: Any) -> bool:
    """Whether the GradScaler scaled a loss: an enabled one makes its scale tensor on its first scale(); a
    disabled one never does (torch.amp.GradScaler._lazy_init_scale_growth_tracker)."""
    return bool(scaler.is_enabled()) and getattr(scaler, "_scale", None) is not None


def _optimizer(opt: torch.optim.Optimizer) -> dict[str, Any]:
    # The first param group's flags, which its step reads (a script's seam sets them there), else the defaults.
    defaults = getattr(opt, "defaults", {}) or {}
    group = {**defaults, **(opt.param_groups[0] if getattr(opt, "param_groups", None) else {})}
    return {
        "optimizer": f"{type(opt).__module__}.{type(opt).__qualname__}",
        "optimizer_fused": group.get("fused"),
        "optimizer_foreach": group.get("foreach"),
    }


def pinned(batch: Any) -> bool:
    """Every tensor of a batch (tuples, lists, dicts) is in pinned memory."""
    tensors = [t for t in _leaves(batch) if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.is_pinned() for t in tensors)


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
        out["batch_pinned"] = pinned(steps)
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


def dynamo_graphs() -> int | None:
    """The graphs dynamo has compiled in this process (a private counter: None where it is absent)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: its absence must not fail a trial
        return None


def cudagraph_skips() -> int | None:
    """The times inductor fell back from CUDA graphs in this process (compile's reduce-overhead: a mutated
    input, a CPU tensor...); None where the counter is absent."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # a private counter: its absence must not fail a trial
        return None


def torch_flag(path: str) -> Any:
    """A torch flag by its dotted name (`torch.backends.cudnn.benchmark`), as the process has it now."""
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def flags() -> dict[str, bool]:
    """The knob list's process flags as this process has them after the steps (a script's own line may have
    set one after the trial did)."""
    return {k.NAME: bool(torch_flag(k.SEEN)) for k in knobs.FLAGS}
