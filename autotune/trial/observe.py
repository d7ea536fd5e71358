"""What the knobs did, seen from inside the worker: effects, not echoes of the config.

`applied` says what each knob was set to; these say what the running model really did with it, so a
knob that silently did nothing shows (scripts/gpu_check.sh asserts them on a GPU):
  * the dtype of the first conv's output (autocast in effect, fp16/bf16),
  * the memory format of that conv's input and output (channels_last in effect),
  * cudnn.benchmark as this process sees it after its steps,
  * whether the model was compiled, and how many graphs dynamo made,
  * NVML's UUID of the GPU sampled for utilisation beside torch's UUID of the trial's device.
"""

from __future__ import annotations

from typing import Any

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
    conv again in backward; the first call is the one recorded."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[str, Any] = {}
        self._handle: Any = None
        if is_compiled(model):
            return
        conv = next((m for m in model.modules() if isinstance(m, nn.modules.conv._ConvNd)), None)
        if conv is not None:
            self._handle = conv.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.seen:
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


def observed(model: nn.Module, device: torch.device, conv: FirstConv, nvml_uuid: str | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(conv.seen)
    out["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    out["compiled"] = is_compiled(model)
    out["compiled_graphs"] = _dynamo_graphs() if out["compiled"] else 0
    if device.type == "cuda":
        out["nvml_uuid"] = nvml_uuid
        out["torch_uuid"] = _torch_uuid(device)
    return out


def _dynamo_graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: its absence must not fail a trial
        return None


def _torch_uuid(device: torch.device) -> str | None:
    try:
        return str(torch.cuda.get_device_properties(device).uuid)  # "58b2e1b9-...", without NVML's "GPU-"
    except Exception:
        return None
