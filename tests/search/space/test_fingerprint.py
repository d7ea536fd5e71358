"""autotune/search/space/machine.py: what this machine really is, and which differences make timings incomparable."""

from __future__ import annotations

import json
import os
import platform
import sys

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.search.space.machine import COMPARED, differences, fingerprint
from tests.fakes import UUID_A, UUID_B, FakeGpu, FakeNvml

CFG = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=96)


def cpuinfo_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def test_fingerprint_of_this_machine() -> None:
    fp = fingerprint(CFG)
    assert set(COMPARED) <= set(fp)
    assert fp["cpu_cores"] == os.cpu_count()
    assert fp["torch"] == torch.__version__
    assert fp["pipeline"] == "tests.fault_pipelines:tiny" and fp["image_size"] == 96
    assert fp["host"] == platform.node()
    model = cpuinfo_model()
    assert isinstance(fp["cpu_model"], str) and fp["cpu_model"]
    if model is not None:  # Linux: the kernel's own name for this CPU
        assert fp["cpu_model"] == model
    if not torch.cuda.is_available():
        assert (fp["gpu_names"], fp["gpu_count"], fp["driver"], fp["cuda"]) == ([], 0, None, None)
        assert (fp["gpu_memory"], fp["gpu_mig"], fp["cudnn"]) == ([], [], None)
    else:  # pragma: no cover - on a GPU machine
        assert fp["gpu_count"] == torch.cuda.device_count() == len(fp["gpu_names"])
        assert fp["cuda"] == torch.version.cuda


def test_fingerprint_survives_the_study_attrs() -> None:
    """Stored as a study user attr (JSON) and compared later: a round trip must not change it."""
    fp = fingerprint(CFG)
    assert differences(json.loads(json.dumps(fp)), fingerprint(CFG)) == []


def test_fingerprint_follows_the_workload() -> None:
    a, b = fingerprint(CFG), fingerprint(CFG.replace(image_size=128, pipeline="unet"))
    assert (b["pipeline"], b["image_size"]) == ("unet", 128)
    diff = differences(a, b)
    assert len(diff) == 2
    assert any(d.startswith("pipeline:") and "'unet'" in d for d in diff)
    assert any(d.startswith("image_size:") and "96" in d and "128" in d for d in diff)


def test_fingerprint_on_a_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A), FakeGpu(UUID_B)], driver="550.54.15"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    fp = fingerprint(CFG)
    assert fp["cpu_cores"] == 64
    assert fp["gpu_names"] == ["NVIDIA H200 #0", "NVIDIA H200 #1"] and fp["gpu_count"] == 2
    assert fp["cuda"] == "12.8"
    assert fp["driver"] == "550.54.15"
    json.dumps(fp)  # still storable


def test_fingerprint_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))  # "NVML Shared Library Not Found"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "GPU")
    fp = fingerprint(CFG)
    assert fp["gpu_count"] == 1 and fp["driver"] is None  # unknown, not an error


# --- differences ------------------------------------------------------------------------------------

BASE = {
    "gpu_names": ["A100"],
    "gpu_count": 1,
    "gpu_memory": [40 * 2**30],
    "gpu_mig": ["off"],
    "driver": "535",
    "cpu_model": "EPYC",
    "cpu_cores": 32,
    "torch": "2.5.0",
    "cuda": "12.4",
    "cudnn": 90100,
    "pipeline": "unet",
    "image_size": 128,
    "host": "node-1",
}


def test_identical_fingerprints_have_no_differences() -> None:
    assert differences(BASE, dict(BASE)) == []


@pytest.mark.parametrize(
    "key, new",
    [
        ("gpu_names", ["H100"]),
        ("gpu_count", 2),
        ("cpu_model", "Xeon"),
        ("cpu_cores", 16),
        ("torch", "2.6.0"),
        ("cuda", "12.8"),
        ("pipeline", "pkg:make"),
        ("image_size", 256),
        ("cudnn", 90300),  # another cuDNN: other kernels, other heuristics
        ("gpu_mig", ["NVIDIA A100-SXM4-40GB MIG 3g.20gb"]),  # a MIG slice is not the whole GPU
        ("gpu_mig", ["on"]),
        ("gpu_memory", [80 * 2**30]),  # the 80 GB A100, same name on some drivers
    ],
)
def test_each_compared_key_is_named(key: str, new: object) -> None:
    diff = differences(BASE, {**BASE, key: new})
    assert len(diff) == 1
    assert diff[0].startswith(f"{key}:") and repr(BASE[key]) in diff[0] and repr(new) in diff[0]


def test_several_changes_are_all_named() -> None:
    diff = differences(BASE, {**BASE, "torch": "2.6.0", "cpu_cores": 8, "gpu_count": 0})
    assert sorted(d.split(":", 1)[0] for d in diff) == ["cpu_cores", "gpu_count", "torch"]


def test_informational_keys_are_ignored() -> None:
    """Another host of the same model, a driver update: the timings still compare."""
    assert differences(BASE, {**BASE, "host": "node-2", "driver": "550", "extra": 1}) == []


def test_a_missing_compared_key_is_a_difference() -> None:
    old = {k: v for k, v in BASE.items() if k != "image_size"}  # recorded before the key existed
    diff = differences(old, BASE)
    assert len(diff) == 1 and diff[0].startswith("image_size:") and "None" in diff[0]


def test_a_fingerprint_from_before_the_new_keys_still_compares() -> None:
    """Recorded by an older autotune: no cudnn, gpu_memory, gpu_mig. Unknown is not different."""
    old = {k: v for k, v in BASE.items() if k not in ("cudnn", "gpu_memory", "gpu_mig")}
    assert differences(old, BASE) == []


def test_per_gpu_values_nvml_could_not_read_are_unknown() -> None:
    assert differences({**BASE, "gpu_memory": [None], "gpu_mig": [None]}, BASE) == []
    assert differences(BASE, {**BASE, "gpu_memory": [None], "gpu_mig": [None]}) == []
    diff = differences({**BASE, "gpu_count": 2, "gpu_memory": [None, None]}, BASE)  # a GPU fewer: named
    assert sorted(d.split(":", 1)[0] for d in diff) == ["gpu_count", "gpu_memory"]


# --- what NVML tells of the GPUs ----------------------------------------------------------------------


def gpu_machine(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, names: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: names[i])
    monkeypatch.setattr(torch._C._cudnn, "getVersionInt", lambda: 90300)  # what cudnn.version() reads


def test_fingerprint_records_memory_mig_and_cudnn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    gpu_machine(
        monkeypatch,
        FakeNvml([FakeGpu(UUID_A, memory=80 * 2**30, mig_mode=None), FakeGpu(UUID_B, memory=40 * 2**30)]),
        ["A100 40GB", "V100"],
    )
    fp = fingerprint(CFG)
    assert fp["gpu_memory"] == [40 * 2**30, 80 * 2**30]  # in CUDA's order: NVML's GPU 1 first
    assert fp["gpu_mig"] == ["off", "off"]  # MIG disabled; MIG not supported at all
    assert fp["cudnn"] == 90300
    assert not torch.cuda.is_initialized()
    json.dumps(fp)


def test_fingerprint_tells_a_mig_slice_from_the_whole_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = FakeGpu(UUID_A, memory=40 * 2**30, mig_mode=1, name="NVIDIA A100-SXM4-40GB")
    mig = FakeGpu(
        "MIG-5c4d3e2f-cccc-4a5b-8c7d-222222222222",
        memory=5 * 2**30,
        parent=whole,
        name="NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig.uuid)
    gpu_machine(monkeypatch, FakeNvml([whole], slices=(mig,)), ["NVIDIA A100-SXM4-40GB MIG 1g.5gb"])
    on_slice = fingerprint(CFG)
    assert on_slice["gpu_memory"] == [5 * 2**30] and on_slice["gpu_mig"] == ["NVIDIA A100-SXM4-40GB MIG 1g.5gb"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    whole.mig_mode = 0
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA A100-SXM4-40GB")
    diff = differences(on_slice, fingerprint(CFG))
    assert {d.split(":", 1)[0] for d in diff} == {"gpu_names", "gpu_memory", "gpu_mig"}


def test_driver_from_an_old_pynvml_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu_machine(monkeypatch, FakeNvml([FakeGpu(UUID_A)], driver="470.82.01", bytes=True), ["T4"])
    fp = fingerprint(CFG)
    assert fp["driver"] == "470.82.01"  # not "b'470.82.01'"
    assert fp["gpu_memory"] == [80 * 2**30] and fp["gpu_mig"] == ["off"]


def test_fingerprint_without_nvml_leaves_per_gpu_values_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_machine(monkeypatch, FakeNvml([], init_fails=True), ["A100", "A100"])
    fp = fingerprint(CFG)
    assert fp["gpu_memory"] == [None, None] and fp["gpu_mig"] == [None, None] and fp["driver"] is None


def test_cudnn_version_is_the_one_torch_reports() -> None:
    from autotune.search.space import machine as module

    assert module._cudnn() == torch.backends.cudnn.version()  # safe to call here: no CUDA to check
