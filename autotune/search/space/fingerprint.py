"""What the timings depend on: hardware and software. Studies refuse to mix fingerprints."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any
from collections.abc import Mapping

from autotune.core.config import TrialConfig
from autotune.trial.nodes import Placement

# Keys that must match for timings to be comparable (the rest is informational: another host of the
# same model, a driver update).
COMPARED = (
    "gpu_names",
    "gpu_count",
    "gpu_memory",
    "gpu_mig",
    "cpu_model",
    "cpu_cores",
    "torch",
    "cuda",
    "cudnn",
    "pipeline",
    "image_size",
    "nodes",
)
# Compared keys added later: a fingerprint recorded before them lacks them, and says nothing either way.
ADDED = frozenset({"gpu_memory", "gpu_mig", "cudnn", "nodes"})
# Per-GPU values read through NVML, None where it could not tell: unknown, so not a difference.
PER_GPU = frozenset({"gpu_memory", "gpu_mig"})


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver(pynvml: Any) -> str | None:
    from autotune.trial.measure import text  # lazy: it imports torch, and differences() needs none of it

    try:
        return text(pynvml.nvmlSystemGetDriverVersion())  # old pynvml: bytes, and str() kept the b'...'
    except Exception:
        return None


def _cudnn() -> int | None:
    """torch.backends.cudnn.version() without its first-call check of every device's capability, which
    initialises CUDA in this (controller) process and raises on SM < 7.5 with cuDNN >= 9.11."""
    try:
        from torch._C import _cudnn as lib

        return int(lib.getVersionInt())  # the loaded library's cudnnGetVersion(): no CUDA context
    except Exception:  # a torch built without cuDNN
        return None


def _gpus(pynvml: Any, n: int) -> tuple[list[int | None], list[str | None]]:
    """Per visible GPU: total memory in bytes, and MIG: "off", "on" (a whole GPU in MIG mode), or the
    slice's name, which names its profile ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"): a slice, or a 40 GB and
    an 80 GB board, may carry the whole GPU's name. None: NVML could not say."""
    from autotune.trial.measure import text, visible_handles

    memory: list[int | None] = [None] * n
    mig: list[str | None] = [None] * n
    if pynvml is None:
        return memory, mig
    try:
        handles = visible_handles(pynvml)[:n]
    except Exception:
        return memory, mig
    for i, h in enumerate(handles):
        with contextlib.suppress(Exception):
            memory[i] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        try:
            if pynvml.nvmlDeviceIsMigDeviceHandle(h):
                mig[i] = text(pynvml.nvmlDeviceGetName(h))
            else:
                mig[i] = "on" if pynvml.nvmlDeviceGetMigMode(h)[0] else "off"
        except Exception as e:  # NOT_SUPPORTED: a GPU without MIG (pre-Ampere, consumer cards)
            if getattr(e, "value", None) == getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                mig[i] = "off"
    return memory, mig


def fingerprint(base: TrialConfig) -> dict[str, Any]:
    import torch

    from autotune.trial.measure import nvml

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    pynvml = nvml() if gpus else None
    memory, mig = _gpus(pynvml, len(gpus))
    return {
        "gpu_names": gpus,
        "gpu_count": len(gpus),
        "gpu_memory": memory,
        "gpu_mig": mig,
        "driver": _driver(pynvml) if pynvml else None,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if gpus else None,
        "cudnn": _cudnn() if gpus else None,  # its kernels and heuristics change the timings
        "pipeline": base.pipeline,
        "image_size": base.image_size,
        "nodes": Placement.from_env().nodes,  # the session's --nodes: a trial's ranks span that many machines
        "host": platform.node(),
    }


def _same(key: str, a: Any, b: Any) -> bool:
    if key in PER_GPU and isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(x is None or y is None or x == y for x, y in zip(a, b))
    return bool(a == b)


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    return [
        f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}"
        for k in COMPARED
        if not (k in ADDED and k not in recorded) and not _same(k, recorded.get(k), current.get(k))
    ]
