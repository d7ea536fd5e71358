"""The fakes that tests share, in one place: NVML (pynvml) and apex for a machine with neither, a free
TCP port, and the fault pipelines' trial config. The fixtures built on them (a fake apex on sys.path,
a warm server per module) are in conftest.py."""

from __future__ import annotations

import socket
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Container

from autotune.core.config import TrialConfig

# --- NVML -------------------------------------------------------------------------------------------

NOT_SUPPORTED, NOT_FOUND, GPU_IS_LOST = 3, 6, 15  # pynvml's NVML_ERROR_* values
UUID_A = "GPU-1f0e2d3c-aaaa-4b5c-8d9e-000000000000"
UUID_B = "GPU-7a6b5c4d-bbbb-4e3f-9a1b-111111111111"
ALWAYS = range(0, 2**62)  # FakeGpu.fail_at for a GPU whose every utilisation sample fails


class NVMLError(Exception):
    """pynvml.NVMLError: built from an NVML return code, str() is its text."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


@dataclass(eq=False)  # a handle: compared by identity, as NVML's are
class FakeGpu:
    uuid: str
    util: list[float] = field(default_factory=lambda: [50.0])
    capability: tuple[int, int] = (9, 0)
    memory: int = 80 * 2**30
    mig_mode: int | None = 0  # None: MIG not supported (pre-Ampere)
    name: str = "NVIDIA H100"
    parent: FakeGpu | None = None  # set on a MIG slice
    fail_at: Container[int] = field(default_factory=set)  # utilisation sample numbers that raise
    asked: int = 0


class FakeNvml(types.ModuleType):
    """What autotune calls of pynvml. `gpus` are NVML's devices by index (PCI order); `slices` are MIG
    devices, reachable by UUID only. bytes=True answers strings as old pynvml did. It records the
    indices asked for, the handles sampled and the utilisation it answered."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED

    def __init__(
        self,
        gpus: list[FakeGpu],
        slices: tuple[FakeGpu, ...] = (),
        driver: str = "550.54.15",
        init_fails: bool = False,
        bytes: bool = False,
    ) -> None:
        super().__init__("pynvml")
        self.gpus, self.slices, self.driver = list(gpus), list(slices), driver
        self.init_fails, self.bytes = init_fails, bytes
        self.indices: list[int] = []
        self.sampled: list[FakeGpu] = []
        self.answered: list[float] = []

    def _s(self, s: str) -> Any:
        return s.encode() if self.bytes else s

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise NVMLError(12, "NVML Shared Library Not Found")

    def nvmlSystemGetDriverVersion(self) -> Any:
        return self._s(self.driver)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self.indices.append(index)
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2, "Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> FakeGpu:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self.gpus + self.slices:
            if g.uuid == uuid:
                return g
        raise NVMLError(NOT_FOUND, "Not Found")

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> Any:
        return self._s(h.uuid)

    def nvmlDeviceGetName(self, h: FakeGpu) -> Any:
        return self._s(h.name)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> types.SimpleNamespace:
        n, h.asked = h.asked, h.asked + 1
        if n in h.fail_at:
            raise NVMLError(GPU_IS_LOST, "GPU is lost")
        self.sampled.append(h)
        value = h.util[n % len(h.util)]
        self.answered.append(value)
        return types.SimpleNamespace(gpu=value, memory=0)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        if h.parent is not None:
            raise NVMLError(NOT_SUPPORTED, "Not Supported")  # asked of a MIG slice: ask its GPU
        return h.capability

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=h.memory, free=h.memory, used=0)

    def nvmlDeviceIsMigDeviceHandle(self, h: FakeGpu) -> int:
        return int(h.parent is not None)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> list[int]:
        if h.mig_mode is None or h.parent is not None:
            raise NVMLError(NOT_SUPPORTED, "Not Supported")
        return [h.mig_mode, h.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return 7 if h.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeGpu:
        mine = [s for s in self.slices if s.parent is h]
        if not 0 <= index < len(mine):
            raise NVMLError(NOT_FOUND, "Not Found")
        return mine[index]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: FakeGpu) -> FakeGpu:
        if h.parent is None:
            raise NVMLError(2, "Invalid Argument")
        return h.parent


# --- apex -------------------------------------------------------------------------------------------

APEX_MODULES = ("apex", "apex.optimizers", "amp_C")

FAKE_FUSED_ADAM = '''
import torch


class FusedAdam(torch.optim.AdamW):
    """apex/optimizers/fused_adam.py's constructor and zero_grad(), on torch's AdamW maths (CPU)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0., amsgrad=False, set_grad_none=True, capturable=False, master_weights=False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam_w_mode, self.weight_decay, self.set_grad_none = adam_w_mode, weight_decay, set_grad_none
        self.zero_grad_calls = 0

    def zero_grad(self):  # apex's: no set_to_none; given one, Python raises TypeError
        self.zero_grad_calls += 1
        if self.set_grad_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
        else:
            super().zero_grad()  # torch's default: set_to_none=True
'''


def write_fake_apex(root: Path, with_kernels: bool = True) -> Path:
    """An apex install under `root` with apex's FusedAdam signatures; without its compiled kernels
    (`amp_C`) it is a Python-only build, which autotune must not count as apex."""
    (root / "apex" / "optimizers").mkdir(parents=True)
    (root / "apex" / "__init__.py").write_text("")
    (root / "apex" / "optimizers" / "__init__.py").write_text(FAKE_FUSED_ADAM)
    if with_kernels:
        (root / "amp_C.py").write_text("multi_tensor_adam = None  # the compiled kernels, faked\n")
    return root


# --- processes and trials ---------------------------------------------------------------------------

# Enough for the trial code to run warm, far cheaper to start than a search's preload (torchvision, smp).
LIGHT_PRELOAD = ("torch", "autotune.trial.loop.worker", "autotune.trial.loop.harness")


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it), for a server a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fault_cfg(factory: str = "tiny", module: str = "tests.fault_pipelines", **changes: Any) -> TrialConfig:
    """A short trial of one of the fault pipelines: one warm-up step, four timed, two per window."""
    base = TrialConfig(pipeline=f"{module}:{factory}", batch_size=4, warmup_steps=1, timed_steps=4, window=2)
    return base.replace(**changes)


class ProcNvml(FakeNvml):
    """NVML with compute processes per device: `procs` maps a handle to the pids computing on it."""

    def __init__(self, gpus: list[FakeGpu], procs: dict[int, list[int]]) -> None:
        super().__init__(gpus)
        self.procs = procs

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in self.procs.get(id(h), [])]
