"""autotune/trial/measurement/measure.py, NVML side: CUDA device -> NVML handle (CUDA_VISIBLE_DEVICES, UUIDs, MIG)
and a sampler that survives NVML errors, says why under MIG there is no utilisation to sample, and lists
the pids computing on the sampled device, among them this process by the pid NVML knows it by (the host's, in a
container's own pid namespace). pynvml is a fake (tests/fakes.py): this machine has no GPU and no NVML."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.trial.measurement import measure, observe
from tests.conftest import wait_for
from tests.fakes import NOT_SUPPORTED, UUID_A, UUID_B, FakeGpu, FakeNvml, ProcNvml


def two_gpus(**b: Any) -> FakeNvml:
    """NVML's GPU 0 is busy at 10 %, GPU 1 at 90 %: a sample says which one was read."""
    return FakeNvml([FakeGpu(UUID_A, util=[10.0]), FakeGpu(UUID_B, util=[90.0], **b)])


def no_torch_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch cannot name the device's UUID (an old torch, or no CUDA here): CUDA_VISIBLE_DEVICES decides."""

    def fail(device: object = None) -> object:
        raise AssertionError("Torch not compiled with CUDA enabled")

    monkeypatch.setattr(torch.cuda, "get_device_properties", fail)


def torch_uuids(monkeypatch: pytest.MonkeyPatch, *uuids: str) -> None:
    """torch's cuda:i has cudaDeviceProp.uuid uuids[i], printed as torch does: no GPU-/MIG- prefix."""

    def props(device: object = None) -> types.SimpleNamespace:
        i = device.index if isinstance(device, torch.device) else int(device)  # type: ignore[arg-type]
        return types.SimpleNamespace(uuid=uuids[i].split("-", 1)[1], major=9, minor=0)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)


def sample(fake: FakeNvml, device: torch.device, n: int = 3) -> measure.GpuUtilSampler:
    with measure.GpuUtilSampler(device, interval_s=0.002) as util:
        assert util._thread is not None, util.first_error
        assert wait_for(lambda: len(util.samples) >= n)
    return util


@pytest.fixture(autouse=True)
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = two_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    no_torch_uuid(monkeypatch)
    return fake


# --- which GPU is sampled ---------------------------------------------------------------------------


def test_visible_index_maps_to_that_nvml_device(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES=1: this process's cuda:0 is NVML's GPU 1, not NVML's GPU 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    util = sample(nvml, torch.device("cuda", 0))
    assert set(nvml.sampled) == {nvml.gpus[1]} and util.mean == 90.0


def test_visible_uuid_maps_to_that_nvml_device(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", UUID_B)
    assert sample(nvml, torch.device("cuda", 0)).mean == 90.0


def test_visible_uuid_prefix_maps_to_that_nvml_device(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUID_B[:12]},{UUID_A}")  # CUDA takes unambiguous prefixes
    assert sample(nvml, torch.device("cuda", 0)).mean == 90.0
    assert sample(nvml, torch.device("cuda", 1)).mean == 10.0


def test_torch_uuid_wins_over_the_index_mapping(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's own UUID is exact even where CUDA's order is not NVML's (fastest-first)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    torch_uuids(monkeypatch, UUID_B, UUID_A)  # CUDA enumerated the faster GPU 1 first
    assert sample(nvml, torch.device("cuda", 0)).mean == 90.0
    util = sample(nvml, torch.device("cuda", 1))
    assert util.mean == 10.0 and util.uuid == UUID_A  # the sampled GPU's UUID, for gpu_check to compare


MIG_UUID = "MIG-5c4d3e2f-cccc-4a5b-8c7d-222222222222"


class MigNvml(FakeNvml):
    """NVML as it answers under MIG: no utilisation for a slice, nor for its GPU while MIG mode is on."""

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> types.SimpleNamespace:
        if h.parent is not None or h.mig_mode == 1:
            h.asked += 1
            raise self.NVMLError(NOT_SUPPORTED, "Not Supported")
        return super().nvmlDeviceGetUtilizationRates(h)


def mig_machine(monkeypatch: pytest.MonkeyPatch) -> tuple[MigNvml, FakeGpu, FakeGpu]:
    gpu = FakeGpu(UUID_A, util=[10.0], mig_mode=1)
    mig = FakeGpu(MIG_UUID, util=[30.0], parent=gpu)
    fake = MigNvml([gpu], slices=(mig,))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake, gpu, mig


def test_a_mig_slice_is_found_by_its_uuid_and_says_utilisation_is_na(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, _, mig = mig_machine(monkeypatch)
    torch_uuids(monkeypatch, mig.uuid)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        time.sleep(0.05)
    assert util._handle is mig and util.uuid == MIG_UUID  # the slice itself, not its GPU
    # Not sampled, not counted as errors: NVML has no utilisation to give under MIG, and says why.
    assert util._thread is None and mig.asked == 0 and fake.sampled == []
    assert util.mean is None and util.errors == 0 and util.first_error == measure.MIG_NO_UTILISATION
    assert util.first_error.startswith("n/a under MIG")


def test_a_gpu_in_mig_mode_reached_by_index_says_utilisation_is_na(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch cannot name the slice's UUID: the index mapping gives its GPU, whose MIG mode is on."""
    _, gpu, _ = mig_machine(monkeypatch)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        time.sleep(0.05)
    assert util._handle is gpu and gpu.asked == 0
    assert util.errors == 0 and util.first_error == measure.MIG_NO_UTILISATION


def test_utilisation_never_supported_is_said_once_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device NVML does not count utilisation for, without MIG showing: one answer, not a lost sample each time."""
    gpu = FakeGpu(UUID_A)
    fake = FakeNvml([gpu])

    def not_supported(h: FakeGpu) -> object:
        h.asked += 1
        raise fake.NVMLError(NOT_SUPPORTED, "Not Supported")

    fake.nvmlDeviceGetUtilizationRates = not_supported  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        assert util._thread is not None and wait_for(lambda: not util._thread.is_alive())
    assert gpu.asked == 1 and util.errors == 0 and util.mean is None
    assert util.first_error is not None and util.first_error.startswith("n/a: NVML does not report utilisation")


# --- which processes NVML sees on the sampled device --------------------------------------------------


def test_compute_pids_are_the_sampled_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES=1: the pids are those NVML lists on GPU 1, the device sampled, not GPU 0's."""
    gpus = [FakeGpu(UUID_A), FakeGpu(UUID_B)]
    fake = ProcNvml(gpus, {id(gpus[0]): [111, 222], id(gpus[1]): [os.getpid(), 333]})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    util = measure.GpuUtilSampler(torch.device("cuda", 0))
    assert util.compute_pids() == (sorted([os.getpid(), 333]), None)


def test_compute_pids_say_why_nvml_cannot_list_them(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    pids, why = measure.GpuUtilSampler(torch.device("cuda", 0)).compute_pids()  # this fake has no such call
    assert pids is None and why is not None and "nvmlDeviceGetComputeRunningProcesses" in why
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")  # no handle at all
    pids, why = measure.GpuUtilSampler(torch.device("cuda", 0)).compute_pids()
    assert pids is None and why is not None and "GPU-ffff" in why
    assert measure.GpuUtilSampler(torch.device("cpu")).compute_pids()[0] is None


def test_a_device_nvml_cannot_map_is_not_sampled(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")  # no such GPU
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        assert util._thread is None  # rather nothing than another GPU's numbers
    assert util.mean is None and util.first_error and "GPU-ffff" in util.first_error


@pytest.mark.parametrize(
    "value, want",
    [
        (None, None),
        ("", []),
        ("1", ["1"]),
        ("3, 5", ["3", "5"]),
        ("1gpu,0", ["1", "0"]),
        ("1,-1,0", ["1"]),
        ("1,x,0", ["1"]),
        ("0,0", []),
        (f"{UUID_A},{UUID_B}", [UUID_A, UUID_B]),
        (f"{UUID_A},1", [UUID_A]),
        ("MIG-abc", ["MIG-abc"]),
    ],
)
def test_visible_devices_are_read_as_cuda_reads_them(
    monkeypatch: pytest.MonkeyPatch, value: str | None, want: list[str] | None
) -> None:
    if value is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert measure.visible_devices() == want


def test_visible_handles_follow_cuda_visible_devices(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    assert measure.visible_handles(nvml) == nvml.gpus  # unset: all of them, NVML's order
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert measure.visible_handles(nvml) == [nvml.gpus[1], nvml.gpus[0]]


def test_old_pynvml_bytes_are_decoded() -> None:
    assert measure.text(b"GPU-1234") == "GPU-1234" and measure.text("550.54") == "550.54"


# --- NVML errors while sampling ---------------------------------------------------------------------


def test_an_nvml_error_costs_one_sample_only(monkeypatch: pytest.MonkeyPatch) -> None:
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    gpu = FakeGpu(UUID_A, util=[10.0, 20.0, 30.0, 40.0], fail_at={2})  # the 3rd sample fails
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        assert wait_for(lambda: len(util.samples) >= 5)
        assert util._thread is not None and util._thread.is_alive()  # kept going past the error
    assert died == []  # nothing escaped the thread
    assert util.errors == 1 and util.first_error is not None and "GPU is lost" in util.first_error
    assert util.samples[:4] == [10.0, 20.0, 40.0, 10.0]  # the failed sample is not a number
    assert util.mean == pytest.approx(sum(util.samples) / len(util.samples))


def test_a_lost_gpu_gives_no_mean_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(UUID_A, fail_at=set(range(10_000)))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]))
    with measure.GpuUtilSampler(torch.device("cuda", 0), interval_s=0.002) as util:
        assert wait_for(lambda: util.errors >= 3)
    assert util.mean is None and util.samples == [] and util.errors >= 3
    assert util.first_error is not None and "GPU is lost" in util.first_error


def test_without_nvml_the_sampler_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))
    with measure.GpuUtilSampler(torch.device("cuda", 0)) as util:
        assert util._thread is None
    assert util.mean is None and util.errors == 0 and util.first_error == "NVML unavailable"


def test_cpu_sampler_stays_a_no_op(nvml: FakeNvml) -> None:
    with measure.GpuUtilSampler(torch.device("cpu"), interval_s=0.002) as util:
        time.sleep(0.02)
    assert util._thread is None and util.mean is None and util.errors == 0 and util.first_error is None
    assert nvml.sampled == []


# --- which pid NVML knows this process by ------------------------------------------------------------------


def proc_self(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, namespace: str, nspid: str | None) -> None:
    """/proc/self as Linux shows it: the pid namespace's link, and status's NSpid (one pid per namespace
    from the one /proc is mounted in down to the process's own)."""
    (tmp_path / "ns").mkdir()
    (tmp_path / "ns" / "pid").symlink_to(namespace)
    (tmp_path / "status").write_text("Name:\tpython\nPid:\t17\n" + (f"NSpid:\t{nspid}\n" if nspid else ""))
    monkeypatch.setattr(measure, "PROC_SELF", tmp_path)


def ddp_rank_nvml(monkeypatch: pytest.MonkeyPatch, *pids: int) -> measure.GpuUtilSampler:
    gpus = [FakeGpu(UUID_A)]
    monkeypatch.setitem(sys.modules, "pynvml", ProcNvml(gpus, {id(gpus[0]): list(pids)}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return measure.GpuUtilSampler(torch.device("cuda", 0))


def test_in_the_host_s_pid_namespace_nvml_knows_this_process_by_its_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc_self(tmp_path, monkeypatch, measure.INIT_PID_NAMESPACE, str(os.getpid()))
    assert measure.nvml_pid() == (os.getpid(), None)
    got = observe.nvml_pids(ddp_rank_nvml(monkeypatch, os.getpid(), 12))
    assert got["nvml_pid"] == got["pid"] == os.getpid() and got["nvml_pid"] in got["nvml_pids"]
    assert "pid_namespace" not in got


def test_in_a_container_s_pid_namespace_nvml_knows_this_process_by_its_host_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML lists host pids: this process is 4242 to it, whatever os.getpid() says inside the container."""
    proc_self(tmp_path, monkeypatch, "pid:[4026532999]", "4242\t17")
    assert measure.nvml_pid() == (4242, None)
    got = observe.nvml_pids(ddp_rank_nvml(monkeypatch, 4242, 5151))
    assert got["pid"] == os.getpid() and got["pid"] not in got["nvml_pids"]  # what a check by pid misses
    assert got["nvml_pid"] == 4242 and got["nvml_pid"] in got["nvml_pids"]


def test_a_container_s_own_proc_cannot_name_this_process_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc_self(tmp_path, monkeypatch, "pid:[4026532999]", "17")  # its own /proc: only its own namespace
    assert measure.nvml_pid() == (None, measure.PID_NAMESPACE)
    got = observe.nvml_pids(ddp_rank_nvml(monkeypatch, 4242))
    assert got["nvml_pid"] is None and got["nvml_pids"] == [4242]
    assert "NVML's pids are the host's" in got["pid_namespace"]
