"""autotune/measure.py: percentiles, clocks, peak memory and the NVML sampler's no-op on CPU."""
from __future__ import annotations

import math
import time

import pytest
import torch

from autotune.trial import measure

CPU = torch.device("cpu")


@pytest.mark.parametrize("xs, q, want", [
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
    ([4.0, 1.0, 3.0, 2.0], 0.5, 2.5),  # unsorted input
    ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0),
    ([0.0, 10.0], 0.9, 9.0),  # linear interpolation between neighbours
    ([1.0, 2.0, 3.0, 4.0, 5.0], 0.9, 4.6),
    ([7.0], 0.5, 7.0),
    ([7.0], 0.9, 7.0),
])
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
