"""Honest clocks: synchronize before reading, account data waits, sample GPU utilisation."""
from __future__ import annotations

import resource
import threading
import time
from typing import Sequence

import torch


def sync(device: torch.device) -> None:
    # Kernels run asynchronously: a clock read without a sync times the launch, not the work.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: max allocated by the caching allocator. CPU: this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


class GpuUtilSampler:
    """Background NVML sampling of GPU utilisation; a no-op (mean None) without a GPU."""

    def __init__(self, device: torch.device, interval_s: float = 0.1) -> None:
        self.samples: list[float] = []
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no driver / no NVML: utilisation is simply unknown
            self._handle = None

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(self._interval):
            self.samples.append(float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))

    def __enter__(self) -> GpuUtilSampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
