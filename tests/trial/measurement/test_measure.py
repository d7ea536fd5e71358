"""autotune/measure.py: percentiles, clocks, peak memory, and the NVML sampler: a no-op on CPU, sampling on a (fake) GPU."""

from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import pytest
import torch

from autotune.trial.measurement import measure
from tests.conftest import wait_for
from tests.fakes import ALWAYS, FakeGpu, FakeNvml

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "xs, q, want",
    [
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0.5, 2.5),  # unsorted input
        ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),
        ([0.0, 10.0], 0.9, 9.0),  # linear interpolation between neighbours
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.9, 4.6),
        ([7.0], 0.5, 7.0),
        ([7.0], 0.9, 7.0),
    ],
)
def test_percentile(xs: list[float], q: float, want: float) -> None:
    assert measure.percentile(xs, q) == pytest.approx(want)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(measure.percentile([], 0.5))


def test_percentile_leaves_its_input_alone() -> None:
    xs = [3.0, 1.0, 2.0]
    measure.percentile(xs, 0.5)
    assert xs == [3.0, 1.0, 2.0]


def test_now_is_a_monotonic_clock_on_cpu() -> None:
    a = measure.now(CPU)
    time.sleep(0.01)
    b = measure.now(CPU)
    assert b - a >= 0.009


def test_peak_memory_on_cpu_is_this_process_rss() -> None:
    measure.reset_peak_memory(CPU)  # a no-op on CPU, must not raise
    peak = measure.peak_memory_bytes(CPU)
    assert isinstance(peak, int) and peak > 10 * 2**20  # a Python process with torch loaded is > 10 MiB
    block = torch.ones(64 * 2**20 // 4)  # touch 64 MiB more: the peak can only grow
    assert measure.peak_memory_bytes(CPU) >= peak
    del block


def test_gpu_util_sampler_on_cpu_is_a_no_op() -> None:
    with measure.GpuUtilSampler(CPU, interval_s=0.01) as util:
        time.sleep(0.05)
        assert util._thread is None  # no sampling thread without a GPU
    assert util.mean is None and util.samples == []


def test_gpu_util_sampler_mean() -> None:
    util = measure.GpuUtilSampler(CPU)
    util.samples.extend([50.0, 100.0])
    assert util.mean == 75.0


# --- the NVML sampler on a (fake) GPU -------------------------------------------------------------------


def gpus(n: int, util: list[float], init_fails: bool = False, **gpu: Any) -> FakeNvml:
    """NVML with n GPUs, each answering `util` in turn (gpu: FakeGpu's fields, e.g. fail_at)."""
    return FakeNvml(
        [FakeGpu(f"GPU-{i:08d}-0000-4000-8000-000000000000", util=list(util), **gpu) for i in range(n)],
        init_fails=init_fails,
    )


@pytest.fixture(autouse=True)
def index_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake GPU is found by index: no CUDA_VISIBLE_DEVICES, and torch cannot tell a device's UUID
    (tests/trial/measurement/test_nvml.py covers the UUID mapping)."""

    def no_props(device: object = None) -> object:
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_props)


def test_gpu_util_sampler_samples_nvml_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = gpus(2, [20, 50, 90, 100])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 1), interval_s=0.005) as util:
        assert util._thread is not None and util._thread.is_alive()
        assert wait_for(lambda: len(util.samples) >= 6)  # the trial goes on meanwhile
    assert util._thread is not None and not util._thread.is_alive()  # stopped and joined on exit
    assert fake.indices == [1]  # the trial's own device
    assert fake.sampled and all(h is fake.gpus[1] for h in fake.sampled)
    assert util.samples == [float(v) for v in fake.answered]  # every answer kept, in order
    assert util.mean == pytest.approx(sum(fake.answered) / len(fake.answered))
    n = len(util.samples)
    time.sleep(0.05)
    assert len(util.samples) == n  # nothing sampled after the block


def test_gpu_util_sampler_default_cuda_device_is_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = gpus(4, [40])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    with measure.GpuUtilSampler(torch.device("cuda"), interval_s=0.005) as util:
        assert wait_for(lambda: len(util.samples) >= 2)
    assert fake.indices == [3]
    assert util.mean == 40.0


def test_gpu_util_sampler_without_nvml_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = gpus(1, [40], init_fails=True)  # a GPU, but no driver library: utilisation unknown
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.005) as util:
        time.sleep(0.03)
        assert util._thread is None
    assert util.mean is None and fake.answered == []


def test_gpu_util_sampler_when_nvml_fails_mid_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NVML error costs a sample, not the sampling: the thread goes on, counts the errors and keeps
    the first message; the mean is that of the good samples (None with none). Nothing escapes the thread."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))

    fake = gpus(1, [30, 60], fail_at=ALWAYS)  # fails at every call
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.005) as util:
        assert util._thread is not None
        assert wait_for(lambda: util.errors >= 3)
        assert util._thread.is_alive()
    assert util.mean is None and util.samples == []
    assert util.first_error is not None and "GPU is lost" in util.first_error

    fake = gpus(1, [30, 60], fail_at=range(2, 2**62))  # two answers, then the GPU is lost
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.005) as util:
        assert wait_for(lambda: util.errors >= 2)
        assert util._thread is not None and util._thread.is_alive()
    assert util.samples == [30.0, 60.0] and util.mean == 45.0
    assert died == []


# --- the peak of the timed window, not the warm-up's cached workspaces ------------------------------------


class CachingAllocator:
    """torch.cuda's caching allocator, in bytes: a freed block stays reserved (cached, reused by the next
    allocation) until empty_cache() hands the free ones back; the peak is of what is reserved."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak = 0

    def malloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)  # the cache serves it first, then cudaMalloc
        self.peak = max(self.peak, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(
            torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.reserved)
        )
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.peak)


def test_the_peak_is_the_timed_steps_not_the_warm_up_s_workspaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN's benchmark (and max-autotune) try every algorithm in the warm-up, each with its workspace: freed,
    they stay cached. The timed steps need the model's 2 GiB and 1 GiB of activations: 3 GiB, not 8."""
    gib, cuda = 2**30, torch.device("cuda", 0)
    mem = CachingAllocator()
    mem.install(monkeypatch)
    mem.malloc(2 * gib)  # weights, grads, optimizer state
    mem.malloc(6 * gib)  # the warm-up's workspace for the slowest algorithm tried
    mem.free(6 * gib)
    for _ in range(2):  # warm-up steps' activations
        mem.malloc(gib)
        mem.free(gib)
    measure.reset_peak_memory(cuda)
    for _ in range(3):  # the timed steps
        mem.malloc(gib)
        mem.free(gib)
    assert measure.peak_memory_bytes(cuda) == 3 * gib
