"""The cost estimate: a proposal's wall time to a measured result, predicted before launch from what the
study has measured on this machine.

The model, kept simple and stated so its error can be read off (`show` prints it beside each trial):

* the reference is the nearest measured config: the completed, uncontended trial whose knobs differ from
  the proposal's in the fewest places, the micro-batch aside; among those, the nearest micro-batch;
* a step's time follows the samples it computes per rank (micro-batch x accumulation x image pixels).
  With two micro-batches measured on the reference's knobs, the line through them (a fixed part plus a
  per-sample part, both >= 0); with one, in proportion. Proportional is exact where a step is bound per
  sample (a CPU, a saturated GPU) and an overestimate where a GPU is not yet saturated: the reason a
  second measured micro-batch is used when there is one;
* start-up is the reference's; the warm-up is the proposal's untimed steps (its warm-up, and those that
  drain the loader's made-ahead batches before the clock starts: TrialConfig.untimed_steps) at the
  predicted step time, plus the reference's one-off part (its warm-up less its steps: compilation) when it compiled the same way. A
  compile mode no measured trial used adds nothing, so the estimate is then too low, never too high;
* the timed window is the workload's: `timed_steps`, or with a time box at least `window` steps and
  `seconds`;
* what the worker's own clocks miss (the launch, the after-step observations, writing the result) is the
  reference's measured wall time less its parts.

No measured trial yet (the baseline, the warm start alongside it): no estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotune.core.config import KNOBS, TrialConfig
from autotune.search.store.records import TrialRecord


@dataclass(frozen=True)
class Measured:
    """One measured trial's timings, as the estimate scales them."""

    number: int
    cfg: TrialConfig
    startup_s: float
    warmup_s: float
    step_s: float  # mean wall time of one timed step on the slowest rank
    overhead_s: float  # its wall time less start-up, warm-up and the timed window (0: not recorded)

    @property
    def samples(self) -> float:
        """Samples one rank computes per step, in pixels of the baseline's image: what step time follows."""
        return work(self.cfg)

    @property
    def one_off_s(self) -> float:
        """The warm-up's part that does not repeat per step (compilation, allocator, cudnn autotuning)."""
        return max(0.0, self.warmup_s - self.cfg.untimed_steps * self.step_s)


@dataclass(frozen=True)
class WallTimeEstimate:
    """A proposal's predicted wall time to a result, by part."""

    startup_s: float
    warmup_s: float
    warm_steps: int
    timed_s: float
    timed_steps: int
    overhead_s: float
    step_s: float
    source: int  # the trial it was scaled from
    record_s: float = 0.0  # the untimed steps past the window for the losses a check reads (record_steps)

    @property
    def seconds(self) -> float:
        return self.startup_s + self.warmup_s + self.timed_s + self.overhead_s + self.record_s

    def figures(self) -> str:
        """The estimate's parts in one line, for a message."""
        return (
            f"start-up {self.startup_s:.1f} s + {self.warm_steps} warm-up step(s) {self.warmup_s:.1f} s + "
            f"{self.timed_steps} timed step(s) {self.timed_s:.1f} s + "
            + (f"{self.record_s:.1f} s of steps past them for a check + " if self.record_s else "")
            + f"{self.overhead_s:.1f} s around them, at "
            f"{self.step_s:.2f} s a step (scaled from trial {self.source})"
        )


def work(cfg: TrialConfig) -> float:
    return float(cfg.batch_size * cfg.grad_accum * cfg.image_size**2)


def timed_steps(cfg: TrialConfig, step_s: float) -> int:
    """Steps the timed window runs: its count, or with a time box at least a window and the seconds."""
    if cfg.seconds is None:
        return cfg.timed_steps
    return max(cfg.window, math.ceil(cfg.seconds / max(step_s, 1e-9)))


def measurements(study: optuna.Study, base: TrialConfig) -> list[Measured]:
    """The study's completed, uncontended trials that measured a step (a reused figure counts once)."""
    out: list[Measured] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        m = of_record(t.number, TrialRecord.from_frozen(t), base)
        if m is not None:
            out.append(m)
    return out


def of_record(number: int, r: TrialRecord, base: TrialConfig) -> Measured | None:
    sps, startup = r.metrics.get("samples_per_s"), r.metrics.get("startup_s")
    if r.contended or r.repeat_of is not None or not sps or startup is None or not r.metrics.get("timed_steps"):
        return None
    cfg = r.config_for(base)
    step = cfg.batch_size * cfg.grad_accum * int(r.metrics.get("world_size") or 1) / float(sps)
    warm = float(r.metrics.get("warmup_s") or 0.0)
    timed = int(r.metrics["timed_steps"]) * step
    past = float(r.metrics.get("record_s") or 0.0)  # steps a check read past the window: no trial's own cost
    overhead = max(0.0, r.wall_s - float(startup) - warm - timed - past) if r.wall_s else 0.0
    return Measured(number, cfg, float(startup), warm, step, overhead)


def estimate(cfg: TrialConfig, measured: Sequence[Measured]) -> WallTimeEstimate | None:
    """`cfg`'s wall time to a result, scaled from the nearest measured trials; None with none measured."""
    if not measured:
        return None
    ref = min(measured, key=lambda m: (_distance(cfg, m.cfg), abs(math.log(work(cfg) / m.samples)), -m.number))
    step = step_time(cfg, ref, [m for m in measured if _distance(m.cfg, ref.cfg) == 0])
    warm = cfg.untimed_steps
    one_off = ref.one_off_s if ref.cfg.compile == cfg.compile else 0.0
    n = timed_steps(cfg, step)
    past = max(0, cfg.record_steps - warm - n) * step
    return WallTimeEstimate(
        ref.startup_s, warm * step + one_off, warm, n * step, n, ref.overhead_s, step, ref.number, past
    )


def step_time(cfg: TrialConfig, ref: Measured, same: Sequence[Measured]) -> float:
    """A step of `cfg`: through the two nearest measured micro-batches of `ref`'s knobs when there are two
    (a fixed part and a per-sample part, neither below 0), else in proportion to `ref`'s."""
    x = work(cfg)
    by_work = sorted({m.samples: m for m in same}.values(), key=lambda m: abs(math.log(x / m.samples)))
    if len(by_work) < 2:
        return ref.step_s * x / ref.samples
    a, b = by_work[0], by_work[1]
    slope = max(0.0, (b.step_s - a.step_s) / (b.samples - a.samples))
    fixed = a.step_s - slope * a.samples
    if fixed < 0:  # the line would go below zero at small batches: proportional to the nearer one
        return a.step_s * x / a.samples
    return fixed + slope * x


def _distance(a: TrialConfig, b: TrialConfig) -> int:
    """The knobs that say how a step is computed and differ; the micro-batch is scaled, not matched."""
    return sum(getattr(a, k) != getattr(b, k) for k in KNOBS) - (a.batch_size != b.batch_size)
