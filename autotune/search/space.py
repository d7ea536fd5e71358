"""A search space (its knob specs) and its resolution against the hardware. search/space_file.py reads one
from YAML; search/suggest.py turns a resolved space into configs (it is the only caller of `trial.suggest_*`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from autotune.core import cpus
from autotune.core.config import KNOBS, TrialConfig
from autotune.core.errors import SearchSpaceError

# Shipped inside the package (a wheel install has it too); search_spaces/default.yaml in a checkout
# links here. It documents the format; `--space FILE` replaces it.
DEFAULT_SPACE = Path(__file__).resolve().parent / "default_space.yaml"
_DEFAULTS = TrialConfig()
# Only meaningful with worker processes: suggested only when num_workers > 0, else left inert.
WORKER_KNOBS = {"prefetch_factor": None, "persistent_workers": False}
# Only meaningful with more than one process: the strategy, suggested only when gpus > 1.
PARALLEL_KNOBS: dict[str, Any] = {"parallel": "ddp"}
# Only meaningful under fsdp: suggested only when parallel is fsdp (and gpus > 1), else left inert.
FSDP_KNOBS: dict[str, Any] = {
    "fsdp_reshard": True,
    "fsdp_param_dtype": "fp32",
    "fsdp_reduce_dtype": "fp32",
    "fsdp_offload": False,
}


@dataclass(frozen=True)
class Choices:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1
    log: bool = False

    def values(self) -> range:
        return range(self.low, self.high + 1, self.step)


@dataclass(frozen=True)
class Fixed:
    value: Any


Spec = Choices | IntRange | Fixed


@dataclass(frozen=True)
class SearchSpace:
    """knob -> Choices | IntRange | Fixed. Knobs not listed keep the base config's value."""

    knobs: Mapping[str, Spec]
    source: str = "<memory>"

    def __getitem__(self, knob: str) -> Spec:
        return self.knobs[knob]

    def __contains__(self, knob: object) -> bool:
        return knob in self.knobs

    def searched(self) -> list[str]:
        """The knobs Optuna actually samples (not Fixed), in KNOBS order."""
        return [k for k in KNOBS if k in self.knobs and not isinstance(self.knobs[k], Fixed)]

    def grid_size(self) -> int:
        n = 1
        for spec in self.knobs.values():
            n *= (
                len(spec.values)
                if isinstance(spec, Choices)
                else len(spec.values())
                if isinstance(spec, IntRange)
                else 1
            )
        return n

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, spec in self.knobs.items():
            if isinstance(spec, Choices):
                out[k] = {"choices": list(spec.values)}
            elif isinstance(spec, IntRange):
                out[k] = {"low": spec.low, "high": spec.high, "step": spec.step, "log": spec.log}
            else:
                out[k] = {"fixed": spec.value}
        return {"source": self.source, "knobs": out}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SearchSpace:
        knobs: dict[str, Spec] = {}
        for k, s in d["knobs"].items():
            if "choices" in s:
                knobs[k] = Choices(tuple(s["choices"]))
            elif "fixed" in s:
                knobs[k] = Fixed(s["fixed"])
            else:
                knobs[k] = IntRange(int(s["low"]), int(s["high"]), int(s.get("step", 1)), bool(s.get("log", False)))
        return cls(knobs=knobs, source=str(d.get("source", "<memory>")))


# --------------------------------------------------------------------------------------- hardware

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
    # RAM; None: unknown, and configs are not sized before launch (search/memory.py).
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


def resolve(
    space: SearchSpace, hw: Hardware, stages: int | None = None, unsupported: frozenset[str] = frozenset()
) -> tuple[SearchSpace, list[str]]:
    """Narrow `space` to what can have an effect on `hw`; return it with one note per change."""
    n = _Narrowing(space.source, dict(space.knobs))
    parallel = space.knobs.get("parallel")
    if "parallel" in unsupported and parallel is not None and "ddp" not in _spec_values(parallel):
        # Asked for fsdp only: narrowing it to ddp would search something else than what the file says.
        raise n.fail(
            "parallel", f"fsdp: {getattr(unsupported, 'why', {}).get('parallel') or 'not supported by this pipeline'}"
        )
    for k in sorted(unsupported):
        if k not in KNOBS:
            raise SearchSpaceError(f"{space.source}: knob {k!r}: marked unsupported but is not a knob")
        why = getattr(unsupported, "why", {}).get(k)  # a framework job says why (pipelines.frameworks)
        n.fix(k, getattr(_DEFAULTS, k), "not supported by this pipeline" + (f": {why}" if why else ""))
    n_gpus = max(1, hw.gpu_count)
    n.clip("gpus", n_gpus, f"only {n_gpus} device{'s' if n_gpus > 1 else ''} present", strict=True)
    if not hw.cuda:
        n.keep("precision", lambda p: p != "fp16", "fp16 needs CUDA")
        if not hw.cpu_bf16:
            n.keep(
                "precision",
                lambda p: p != "bf16",
                "this CPU has no native bf16 (AVX512-BF16 or AMX): "
                "autocast would emulate it, about 70x slower than fp32",
            )
        n.fix("pin_memory", False, "no CUDA, pinning memory is a no-op")
        n.fix("cudnn_benchmark", False, "no CUDA, cudnn is not used")
        n.fix("compile", "off", "no CUDA, compiling the model on CPU takes minutes and cannot pay for itself")
    n.clip("num_workers", hw.cpu_count, f"{hw.cpu_count} CPUs")
    n.clip("num_threads", hw.cpu_count, f"{hw.cpu_count} CPUs")
    if not hw.apex:
        n.keep("optimizer_fusion", lambda f: f != "apex", "apex.optimizers is not installed")
    if stages == 0:
        n.fix("checkpoint_segments", 0, "pipeline declares no stages, so checkpointing is off")
    elif stages is not None:
        n.clip("checkpoint_segments", stages, f"the pipeline has {stages} stages")
    # No worker processes, no prefetching or persistent workers.
    if _singles(n.knobs).get("num_workers") == Fixed(0):
        for k, inert in WORKER_KNOBS.items():
            n.fix(k, inert, "num_workers is 0")
    _strategy(n, hw)
    return SearchSpace(knobs=_singles(n.knobs), source=space.source), n.notes


def _strategy(n: _Narrowing, hw: Hardware) -> None:
    """parallel and its fsdp sub-knobs, narrowed after gpus: inert with one process, and the sub-knobs
    inert without fsdp."""
    if _singles(n.knobs).get("gpus", Fixed(_DEFAULTS.gpus)) == Fixed(1):
        for knob, value in PARALLEL_KNOBS.items():
            n.fix(knob, value, "gpus is 1: one process, nothing to replicate or shard")
    if "fsdp" not in _spec_values(_singles(n.knobs).get("parallel", Fixed(_DEFAULTS.parallel))):
        for knob, inert in FSDP_KNOBS.items():
            n.fix(knob, inert, "parallel is not fsdp")
        return
    if not hw.cuda:
        n.fix("fsdp_offload", False, "no CUDA: the parameters already live in host memory")
        if not hw.cpu_bf16:
            n.keep("fsdp_param_dtype", lambda d: d != "bf16", "this CPU has no native bf16 (AVX512-BF16 or AMX)")


@dataclass
class _Narrowing:
    """A space being narrowed to the hardware: its knobs so far, and one note per change."""

    source: str
    knobs: dict[str, Spec]
    notes: list[str] = field(default_factory=list)

    def fail(self, knob: str, msg: str) -> SearchSpaceError:
        return SearchSpaceError(f"{self.source}: knob {knob!r}: {msg}")

    def fix(self, knob: str, value: Any, why: str) -> None:
        if knob in self.knobs and self.knobs[knob] != Fixed(value):
            self.knobs[knob] = Fixed(value)
            self.notes.append(f"{knob} fixed to {value!r}: {why}")

    def keep(self, knob: str, ok: Any, why: str) -> None:
        """Drop the values `ok` rejects; a space left with none is an error."""
        spec = self.knobs.get(knob)
        if spec is None:
            return
        vals = (
            [spec.value]
            if isinstance(spec, Fixed)
            else list(spec.values())
            if isinstance(spec, IntRange)
            else list(spec.values)
        )
        kept = [v for v in vals if ok(v)]
        if not kept:
            raise self.fail(knob, f"choices conflict with the hardware: {why}")
        if len(kept) < len(vals):
            self.notes.append(f"{knob}: dropped {', '.join(map(str, [v for v in vals if not ok(v)]))} ({why})")
            self.knobs[knob] = Choices(tuple(kept))

    def clip(self, knob: str, top: int, why: str, strict: bool = False) -> None:
        """Lower the maximum to `top`. strict: values above it are errors, not clipped."""
        spec = self.knobs.get(knob)
        if spec is None:
            return
        if isinstance(spec, Fixed):
            if spec.value is not None and spec.value > top:
                if strict:
                    raise self.fail(knob, f"{knob}={spec.value} but {why}")
                self.fix(knob, top, why)
        elif isinstance(spec, IntRange):
            self._clip_range(knob, spec, top, why, strict)
        else:
            if strict:
                kept = tuple(v for v in spec.values if v <= top)
            else:
                kept = tuple(dict.fromkeys(v if v is None else min(v, top) for v in spec.values))
            if not kept:
                raise self.fail(knob, f"{knob}={min(spec.values)} but {why}")
            if kept != spec.values:
                self.knobs[knob] = Choices(kept)
                self.notes.append(f"{knob}: choices limited to {list(kept)} ({why})")

    def _clip_range(self, knob: str, spec: IntRange, top: int, why: str, strict: bool) -> None:
        if spec.high <= top:
            return
        if spec.low > top:
            if strict:
                raise self.fail(knob, f"{knob}={spec.low} but {why}")
            self.fix(knob, top, why)
            return
        high = spec.low + (top - spec.low) // spec.step * spec.step
        if high == spec.low:
            self.fix(knob, high, why)
        else:
            self.knobs[knob] = IntRange(spec.low, high, spec.step, spec.log)
            self.notes.append(f"{knob}: range clipped to {spec.low}..{high} ({why})")


def _singles(knobs: Mapping[str, Spec]) -> dict[str, Spec]:
    """A range or choice list with one value becomes Fixed: Optuna would still record it as a param."""
    out: dict[str, Spec] = {}
    for k, s in knobs.items():
        vals = list(s.values) if isinstance(s, Choices) else list(s.values()) if isinstance(s, IntRange) else None
        out[k] = Fixed(vals[0]) if vals is not None and len(vals) == 1 else s
    return out


def _spec_values(spec: Spec) -> list[Any]:
    return (
        list(spec.values)
        if isinstance(spec, Choices)
        else list(spec.values())
        if isinstance(spec, IntRange)
        else [spec.value]
    )


__all__ = ["Choices", "Fixed", "Hardware", "IntRange", "SearchSpace", "Spec", "resolve", "usable_cpus"]
