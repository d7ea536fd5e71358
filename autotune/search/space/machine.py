"""This machine, as a study sees it: the hardware facts a space is resolved against (CPUs usable by this
process, CUDA devices and their memory, asked of NVML and never of a CUDA context in this controller,
native bf16, apex), and the fingerprint its timings are tied to: studies refuse to mix fingerprints."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core import cpus
from autotune.core.config import TrialConfig
from autotune.search.space.spec import Fixed, IntRange, Spec
from autotune.trial.processes.placement import Placement

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2 quota: "max 100000" (none) or "<quota> <period>"


def usable_cpus() -> int:
    """CPUs this process may use: os.cpu_count() counts the machine, not the affinity mask (taskset,
    Slurm) nor the container's CPU quota, so workers sized by it oversubscribe."""
    return cpus.usable_cpus(CGROUP_CPU_MAX.parent)  # the one count, shared with each DDP rank's thread share


def cpu_bf16_native() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU. Without them (an AVX2-only CPU), bf16 autocast falls
    back to the reference convolution, some 70x slower than fp32 (benchmarks/README.md, "Figures the
    design rests on"), so a Unet trial in bf16 would time out instead of measuring."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no fast bf16 either
        return False


def memory_bytes(cuda: bool) -> int | None:
    """The smallest visible GPU's memory, asked of NVML (torch would create a CUDA context in this
    controller); on a CPU its RAM, MemTotal: what is available now varies from run to run, and the
    space narrowed by it must not (a resumed study's distributions must stay the same). None: unknown."""
    from autotune.trial.measurement.measure import nvml, visible_handles  # lazy: torch, see _driver

    if not cuda:
        try:
            meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
            return int(meminfo["MemTotal"].split()[0]) * 1024
        except (OSError, KeyError, ValueError, IndexError):  # not Linux
            return None
    pynvml = nvml()
    try:
        return min(int(pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in visible_handles(pynvml)) if pynvml else None
    except Exception:  # noqa: BLE001 - an NVML error (or no handle): not sized, never fatal
        return None


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    gpu_count: int
    cpu_count: int  # usable by this process (affinity, cgroup quota), not the machine's
    apex: bool
    cpu_bf16: bool = True  # native bf16 kernels on this CPU (oneDNN: AVX512-BF16 or AMX)
    # What one rank's memory estimate must fit in: the smallest visible GPU's memory, or on a CPU its
    # RAM; None: unknown, and configs are not sized before launch (search/space/memory.py).
    memory_bytes: int | None = None

    @classmethod
    def detect(cls) -> Hardware:
        import torch  # lazy: loading a space file must stay cheap

        from autotune.trial.loop.knobs.optimizer_fusion import apex_available  # lazy: torch, as above

        cuda = bool(torch.cuda.is_available())
        return cls(
            cuda=cuda,
            gpu_count=torch.cuda.device_count() if cuda else 0,
            cpu_count=usable_cpus(),
            apex=apex_available(),
            cpu_bf16=cpu_bf16_native(),
            memory_bytes=memory_bytes(cuda),
        )

    def workers_per_process(self, processes: int, spec: Spec | None = None) -> int:
        """The usable CPUs shared by a trial's processes (one per GPU), as a worker count `spec` (the space's
        num_workers) allows: the largest not above the share, or its smallest when all are."""
        n = max(1, self.cpu_count // max(1, processes))
        if spec is None or isinstance(spec, Fixed):
            return n if spec is None else int(spec.value)
        allowed = sorted(spec.values() if isinstance(spec, IntRange) else spec.values)
        return max((v for v in allowed if v <= n), default=allowed[0])


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
    from autotune.trial.measurement.measure import text  # lazy: it imports torch, and differences() needs none of it

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
    from autotune.trial.measurement.measure import text, visible_handles  # lazy: torch, see _driver

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

    from autotune.trial.measurement.measure import nvml  # lazy: torch, as above

    names = (  # the machine's devices, whatever the config's count
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    pynvml = nvml() if names else None
    memory, mig = _gpus(pynvml, len(names))
    return {
        "gpu_names": names,
        "gpu_count": len(names),
        "gpu_memory": memory,
        "gpu_mig": mig,
        "driver": _driver(pynvml) if pynvml else None,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if names else None,
        "cudnn": _cudnn() if names else None,  # its kernels and heuristics change the timings
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
