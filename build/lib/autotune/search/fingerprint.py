"""What the timings depend on: hardware and software. Studies refuse to mix fingerprints."""
from __future__ import annotations

import os
import platform
from typing import Any

from autotune.core.config import TrialConfig

# Keys that must match for timings to be comparable (the rest is informational).
COMPARED = ("gpu_names", "gpu_count", "cpu_model", "cpu_cores", "torch", "cuda", "pipeline", "image_size")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        return None


def fingerprint(base: TrialConfig) -> dict[str, Any]:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "gpu_names": gpus,
        "gpu_count": len(gpus),
        "driver": _driver() if gpus else None,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if gpus else None,
        "pipeline": base.pipeline,
        "image_size": base.image_size,
        "host": platform.node(),
    }


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in COMPARED if recorded.get(k) != current.get(k)]
