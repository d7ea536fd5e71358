"""What one trial measured (TrialResult): the figures the worker's clock reduced over ranks, what was in effect
knob by knob, and every step's loss; written to result.json by the worker and read back by the search.

May import: stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured. `applied` records what was really in effect, knob by knob."""

    status: str  # ok | oom | numerics | unsupported | error
    samples_per_s: float | None = None
    step_time_p50: float | None = None
    step_time_p90: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    gpu_util: float | None = None
    gpu_util_errors: int = 0  # NVML samples lost to errors (each rank's GPU is sampled by that rank)
    gpu_util_error: str | None = None  # the first NVML error, or why nothing was sampled
    others_cpu: float | None = None  # CPUs other processes kept busy while this trial measured
    loss_first: float | None = None
    loss_last: float | None = None
    losses: tuple[float, ...] = ()  # every optimizer step's loss, warm-up included (result.json only)
    memory_total_bytes: int | None = None  # what the peak is measured against: device memory, or RAM
    startup_s: float | None = None
    warmup_s: float | None = None  # the warm-up steps' wall time (torch.compile compiles there); not timed
    record_s: float = 0.0  # after the window, the untimed steps run for the losses a check reads (record_steps)
    timed_steps: int = 0
    world_size: int = 1
    device: str = "cpu"
    windows: tuple[float, ...] = ()
    applied: Mapping[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def loss_finite(self) -> bool:
        return _finite(self.loss_first) and _finite(self.loss_last)

    def metrics(self) -> dict[str, Any]:
        """Scalar figures, as stored in Optuna user attrs."""
        keep = (
            "samples_per_s",
            "step_time_p50",
            "step_time_p90",
            "data_wait_fraction",
            "peak_memory_bytes",
            "memory_total_bytes",
            "gpu_util",
            "gpu_util_errors",
            "gpu_util_error",
            "others_cpu",
            "loss_first",
            "loss_last",
            "startup_s",
            "warmup_s",
            "record_s",
            "timed_steps",
            "world_size",
            "device",
        )
        return {k: getattr(self, k) for k in keep}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["windows"] = list(self.windows)
        d["losses"] = list(self.losses)
        d["applied"] = dict(self.applied)
        d["loss_finite"] = self.loss_finite
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialResult:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["windows"] = tuple(kw.get("windows") or ())
        kw["losses"] = tuple(kw.get("losses") or ())
        return cls(**kw)
