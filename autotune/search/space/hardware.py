"""The hardware facts a space is resolved against: CPUs usable by this process, CUDA devices and their
memory (asked of NVML, never of a CUDA context in this controller), native bf16, apex."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autotune.core import cpus
from autotune.search.space.spec import Fixed, IntRange, SearchSpace

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2 quota: "max 100000" (none) or "<quota> <period>"


def usable_cpus() -> int:
    """CPUs this process may use: os.cpu_count() counts the machine, not the affinity mask (taskset,
    Slurm) nor the container's CPU quota, so workers sized by it oversubscribe."""
    return cpus.usable_cpus(CGROUP_CPU_MAX.parent)  # the one count, shared with each DDP rank's thread share


def cpu_bf16_native() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU. Without them (an AVX2-only CPU), bf16 autocast falls
    back to the reference convolution: measured 7.1 s against 0.09 s fp32 for one 64-channel 3x3 conv
    at batch 8, 64 px (AMD EPYC, AVX2), so a Unet trial in bf16 times out instead of measuring."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no fast bf16 either
        return False


def memory_bytes(cuda: bool) -> int | None:
    """The smallest visible GPU's memory, asked of NVML (torch would create a CUDA context in this
    controller); on a CPU its RAM, MemTotal: what is available now varies from run to run, and the
    space narrowed by it must not (a resumed study's distributions must stay the same). None: unknown."""
    from autotune.trial.measure import nvml, visible_handles

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

        from autotune.trial.knobs import apex_available

        cuda = bool(torch.cuda.is_available())
        return cls(
            cuda=cuda,
            gpu_count=torch.cuda.device_count() if cuda else 0,
            cpu_count=usable_cpus(),
            apex=apex_available(),
            cpu_bf16=cpu_bf16_native(),
            memory_bytes=memory_bytes(cuda),
        )

    def workers_per_process(self, processes: int, space: SearchSpace | None = None) -> int:
        """The usable CPUs shared by a trial's processes (one per GPU), as a num_workers `space` allows:
        the largest not above the share, or its smallest when all are."""
        n, spec = max(1, self.cpu_count // max(1, processes)), space.knobs.get("num_workers") if space else None
        if spec is None or isinstance(spec, Fixed):
            return n if spec is None else int(spec.value)
        allowed = sorted(spec.values() if isinstance(spec, IntRange) else spec.values)
        return max((v for v in allowed if v <= n), default=allowed[0])
