"""The warm start against the machine it runs on: bf16 only where the GPU has it natively, decided
without initialising CUDA in the controller; data-loader workers from the CPUs this process may use,
shared by the trial's processes, as a count the space allows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.search.space import machine as space_module
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace
from autotune.search.space.machine import Hardware
from autotune.search.loop.study import warm_start
from tests.fakes import UUID_A, UUID_B, FakeGpu, FakeNvml

BASE = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64)
GPU = Hardware(cuda=True, gpu_count=1, cpu_count=8, apex=False)
CPU = Hardware(cuda=False, gpu_count=0, cpu_count=8, apex=False)


# --- bf16: native only, and CUDA left alone --------------------------------------------------------


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU machine as the controller sees it, where any call that initialises CUDA fails the test."""

    def no_cuda_here() -> None:
        raise AssertionError("the controller initialised CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def nvml_with(monkeypatch: pytest.MonkeyPatch, *caps: tuple[int, int]) -> FakeNvml:
    fake = FakeNvml([FakeGpu(u, capability=c) for u, c in zip((UUID_A, UUID_B), caps)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.mark.parametrize(
    "cap, precision",
    [
        ((7, 0), "fp16"),  # V100: bf16 only emulated, which torch's default is_bf16_supported() counts
        ((7, 5), "fp16"),  # T4
        ((8, 0), "bf16"),  # A100
        ((8, 9), "bf16"),  # L4
        ((9, 0), "bf16"),  # H100
    ],
)
def test_bf16_only_where_the_gpu_has_it(
    gpu_machine: None, monkeypatch: pytest.MonkeyPatch, cap: tuple[int, int], precision: str
) -> None:
    nvml_with(monkeypatch, cap, cap)
    assert warm_start(BASE, GPU).precision == precision
    assert not torch.cuda.is_initialized()


def test_bf16_needs_every_gpu_of_the_trial(gpu_machine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml_with(monkeypatch, (9, 0), (7, 0))
    assert warm_start(BASE, GPU).precision == "bf16"  # one process: cuda:0 only
    assert warm_start(BASE.replace(gpus=2), GPU).precision == "fp16"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # this search's cuda:0 is NVML's GPU 1
    assert warm_start(BASE, GPU).precision == "fp16"


def test_bf16_on_a_mig_slice_is_its_gpus(gpu_machine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(UUID_A, capability=(8, 0), mig_mode=1)
    mig = FakeGpu("MIG-5c4d3e2f-cccc-4a5b-8c7d-222222222222", parent=gpu)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu], slices=(mig,)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig.uuid)
    assert warm_start(BASE, GPU).precision == "bf16"


def test_without_nvml_the_warm_start_takes_fp16(gpu_machine: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))
    assert warm_start(BASE, GPU).precision == "fp16"  # runs on every CUDA GPU; asking torch would init CUDA
    assert not torch.cuda.is_initialized()


def test_on_cpu_the_warm_start_takes_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))
    cfg = warm_start(BASE, CPU)
    assert cfg.precision == "bf16" and not cfg.pin_memory and not cfg.cudnn_benchmark


# --- usable CPUs -------------------------------------------------------------------------------------


@pytest.fixture
def cpu_max(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The container's cgroup v2 cpu.max, and an affinity mask of 8 CPUs on a 96-core machine."""
    path = tmp_path / "cpu.max"
    monkeypatch.setattr(space_module, "CGROUP_CPU_MAX", path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    return path


@pytest.mark.parametrize(
    "content, want",
    [
        (None, 8),  # no cgroup v2 limit: the affinity mask
        ("max 100000\n", 8),  # a cgroup without a quota
        ("200000 100000\n", 2),  # a 2-CPU container
        ("150000 100000\n", 2),  # 1.5 CPUs: rounded up
        ("50000 100000\n", 1),
        ("1600000 100000\n", 8),  # a quota above the mask: the mask
        ("garbage\n", 8),
    ],
)
def test_usable_cpus(cpu_max: Path, content: str | None, want: int) -> None:
    if content is not None:
        cpu_max.write_text(content)
    assert space_module.usable_cpus() == want


def test_detect_counts_the_usable_cpus(cpu_max: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_max.write_text("400000 100000\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Hardware.detect().cpu_count == 4  # not os.cpu_count()'s 96


def test_usable_cpus_of_this_process() -> None:
    assert 1 <= space_module.usable_cpus() <= (os.cpu_count() or 1)


# --- the warm start's workers ------------------------------------------------------------------------


def space(spec: object) -> SearchSpace:
    return SearchSpace(knobs={"num_workers": spec})  # type: ignore[dict-item]


def test_warm_start_workers_are_shared_by_the_trials_processes() -> None:
    hw = Hardware(cuda=True, gpu_count=4, cpu_count=16, apex=False)
    assert warm_start(BASE, hw).num_workers == 16
    assert warm_start(BASE.replace(gpus=4), hw).num_workers == 4  # four ranks, each with its loader
    assert warm_start(BASE.replace(gpus=4), Hardware(cuda=True, gpu_count=4, cpu_count=2, apex=False)).num_workers == 1


def test_warm_start_precision_follows_the_hardware() -> None:
    """AMP where it is fast: bf16 on a CPU with bf16 kernels, fp32 on one without (emulated bf16 is
    ~70x slower and would time the guides' own recommendation out)."""
    assert warm_start(BASE, Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)).precision == "bf16"
    assert (
        warm_start(BASE, Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False, cpu_bf16=False)).precision == "fp32"
    )


@pytest.mark.parametrize(
    "spec, want",
    [
        (IntRange(0, 1), 1),  # the space's max is 1: 1, not 8
        (IntRange(0, 32), 8),
        (IntRange(0, 16, step=4), 8),
        (IntRange(0, 12, step=6), 6),
        (Choices((0, 2, 6, 12)), 6),
        (Choices((12, 16)), 12),  # all above the CPUs: the smallest the space allows
        (IntRange(10, 20), 10),
        (Fixed(3), 3),
    ],
)
def test_warm_start_workers_are_in_the_space(spec: object, want: int) -> None:
    cfg = warm_start(BASE, Hardware(cuda=False, gpu_count=0, cpu_count=8, apex=False), space(spec))
    assert cfg.num_workers == want
    assert cfg.persistent_workers and cfg.prefetch_factor == 2


def test_warm_start_without_workers_has_no_worker_knobs() -> None:
    cfg = warm_start(BASE, CPU, space(Fixed(0)))
    assert (cfg.num_workers, cfg.persistent_workers, cfg.prefetch_factor) == (0, False, None)


def test_a_space_without_num_workers_leaves_the_share() -> None:
    assert warm_start(BASE, CPU, SearchSpace(knobs={"batch_size": Choices((8, 16))})).num_workers == 8
