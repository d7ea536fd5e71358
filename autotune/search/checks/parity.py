"""Parity: before a config is exported as best, it trains side by side with its baseline, from the same
initial weights on the same data order, each in a fresh trial process, and its loss trajectory must
stay within a tolerance of the baseline's.

Why it is built this way:

* The tolerance cannot come from run-to-run spread. On a CPU two fp32 runs with one seed give
  bitwise-identical losses, so a tolerance scaled by that spread is zero and fails any change of
  rounding at all (bf16, a fused optimizer, another memory layout). It is set against natural training noise
  instead: the deviation between the baseline and its data-order twin, the same baseline with
  data_seed + 1 and the same initial weights. Reshuffling the data is a change nobody calls wrong;
  a candidate may move the trajectory as far as it does and no further (FRACTION, chosen on the
  measurements of benchmarks/parity.py, kept in benchmarks/README.md), with a floor for data that hardly varies.
* Trajectories are compared smoothed (a trailing mean over SMOOTH steps): a single step's loss is
  mostly the difficulty of its batch, which is the data-order twin's whole difference at step 1.
* The deviation is mean |smoothed candidate - smoothed baseline| over the mean |smoothed baseline|,
  the noise the same figure for the twin. Their ratio, which decides the verdict, is then free of the
  loss's level (a ratio of mean absolute differences); the percentages are shown for reading.
* A changed global batch is compared at equal samples seen, with the candidate's scaled lr, on the
  larger batch's step grid: the larger-batch run makes K steps and the smaller one K x ratio, so that
  the candidate still gets the K optimizer steps asked for (4 steps of batch 64 against 30 of batch 8
  would say nothing), and the smoothing spans the same samples in both. The noise must cover the same
  window, so a candidate with a larger global batch than the reference covers gets a longer reference.
* Cost: noise_reference() runs the baseline and its twin once per study (2 runs, K steps each); each
  check() then runs only the candidate (1 run), so N candidates cost 2 + N runs. A candidate whose
  global batch is r times the baseline's also needs a reference of r x K baseline steps: 2 more runs,
  each the candidate's own samples. Each run gets timeout_s (measured costs: benchmarks/README.md).
  Reference.to_dict()/from_dict() let a study keep it as a user attr.
* A candidate that fails to train fails its check, naming the failure; a baseline that fails raises
  its TrialFailure (nothing can be checked against it).
* Not checkable, never a pass at the floor: a reference whose runs cannot set a tolerance says why, and
  every check against it is `not checked` with that reason, no candidate run. Its baseline run did not seed
  torch (a script that seeds only under a flag it was not given: no two runs start from the same weights),
  or its data-order twin trained the baseline's own batches (a script whose data order follows no seed the
  trial sets: no at.data_seed(), no DataLoader that shuffles; or the same losses bitwise): a deviation
  would then be measured against a noise of 0, which says nothing of what reshuffling does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialFailure
from autotune.core import outcomes
from autotune.search.store.records import CheckRecord
from autotune.trial.processes.locks import locked_trial
from autotune.trial.processes.warm_client import WarmServer

# Steps of the coarser run per trailing mean (a span of SMOOTH x its global batch samples).
SMOOTH = 5
# tolerance = max(FRACTION x noise, FLOOR): a candidate may move the trajectory as far as one reshuffle
# of the data does, and no further; FLOOR stands in when the data order cannot set a tolerance (a
# dataset of about one batch). Why these values: benchmarks/README.md, "Parity tolerance: measurement history".
FRACTION = 1.0
FLOOR = 0.01


@dataclass(frozen=True)
class Reference:
    """The baseline's trajectory and its data-order twin's: measured once per study, reused by check()."""

    baseline: TrialConfig  # as run: warmup_steps 0, timed_steps = steps
    steps: int
    losses: tuple[float, ...]
    twin_losses: tuple[float, ...]
    seconds: float
    # Why these runs cannot set a tolerance (unseeded, or the twin's data did not change); None: they can.
    not_checkable: str | None = None

    @property
    def samples(self) -> int:
        return self.steps * self.baseline.global_batch_size

    @property
    def noise(self) -> float:
        """The twin's deviation over the whole reference, on the baseline's own step grid."""
        return reference_noise(self, self.samples, self.baseline.global_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.to_dict(),
            "steps": self.steps,
            "losses": list(self.losses),
            "twin_losses": list(self.twin_losses),
            "seconds": self.seconds,
            "noise": self.noise,
            **({"not_checkable": self.not_checkable} if self.not_checkable else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reference:
        return cls(
            TrialConfig.from_dict(d["baseline"]),
            int(d["steps"]),
            tuple(d["losses"]),
            tuple(d["twin_losses"]),
            float(d["seconds"]),
            d.get("not_checkable"),
        )


@dataclass(frozen=True)
class ParityResult:
    """What one parity check found; stored as its CheckRecord (to_dict)."""

    steps: int  # optimizer steps of the larger-global-batch run: the K asked for
    samples: int  # samples seen by each run
    deviation: float | None  # None: the candidate did not train
    tolerance: float | None
    noise: float | None  # the data-order twin's deviation over the same window
    passed: bool
    reason: str
    seconds: float  # wall time of this check, the reference's runs included when it made them
    candidate_steps: int = 0
    baseline_steps: int = 0
    runs: int = 0  # trial processes this check started
    failure: str | None = None  # the candidate's TrialFailure reason
    not_checkable: str | None = None  # the reference's runs cannot set a tolerance: not checked, why

    def to_dict(self) -> CheckRecord:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        d: CheckRecord = {
            "kind": "parity",
            "steps": self.steps,
            "samples": self.samples,
            "deviation": r(self.deviation),
            "tolerance": r(self.tolerance),
            "noise": r(self.noise),
            "verdict": outcomes.Verdict.NOT_CHECKED
            if self.not_checkable
            else outcomes.Verdict.PASS
            if self.passed
            else outcomes.Verdict.FAIL,
            "reason": self.reason,
            "seconds": round(self.seconds, 1),
            "candidate_steps": self.candidate_steps,
            "baseline_steps": self.baseline_steps,
            "runs": self.runs,
            "rule": f"tolerance = max({FRACTION} x data-order noise, {FLOOR}); trailing mean over {SMOOTH} steps",
        }
        if self.failure is not None:
            d["failure"] = self.failure
        return d


def tolerance_for(noise: float) -> float:
    return max(FRACTION * noise, FLOOR)


def smoothed(losses: Sequence[float], per_step: int, points: Sequence[int], span: int) -> list[float]:
    """At each sample count in `points`, the mean loss of the steps that ended within the last `span`
    samples (fewer at the start). Step i (0-based) saw samples i*per_step .. (i+1)*per_step."""
    out = []
    for x in points:
        window = [loss for i, loss in enumerate(losses) if x - span < (i + 1) * per_step <= x]
        if not window:
            raise ValueError(f"no step of {per_step} samples ends within ({x - span}, {x}]")
        out.append(sum(window) / len(window))
    return out


def deviation(
    candidate: Sequence[float],
    candidate_batch: int,
    baseline: Sequence[float],
    baseline_batch: int,
    samples: int,
    grid: int | None = None,
    smooth: int = SMOOTH,
) -> float:
    """mean |smoothed candidate - smoothed baseline| / mean |smoothed baseline| over the first `samples`
    samples, evaluated every `grid` samples (default: the larger global batch, i.e. at its step ends),
    each point a trailing mean over the last smooth x grid samples (the same samples in both runs)."""
    grid = grid or max(candidate_batch, baseline_batch)
    for losses, g in ((candidate, candidate_batch), (baseline, baseline_batch)):
        if len(losses) * g < samples:
            raise ValueError(f"{len(losses)} steps of {g} samples do not cover {samples} samples")
    points = list(range(grid, samples + 1, grid))
    if not points:
        raise ValueError(f"{samples} samples is less than one step of {grid}")
    c = smoothed(candidate, candidate_batch, points, smooth * grid)
    b = smoothed(baseline, baseline_batch, points, smooth * grid)
    scale = sum(abs(v) for v in b) / len(b)
    diff = sum(abs(p - q) for p, q in zip(c, b)) / len(b)
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def reference_noise(reference: Reference, samples: int, grid: int) -> float:
    """The twin's deviation over the first `samples` samples, on the comparison's grid."""
    g = reference.baseline.global_batch_size
    return deviation(reference.twin_losses, g, reference.losses, g, samples, grid)


def noise_reference(
    baseline: TrialConfig, steps: int, folder: Path, timeout_s: float, server: WarmServer | None = None
) -> Reference:
    """Run the baseline and its data-order twin (data_seed + 1, the same initial weights) for `steps`
    optimizer steps, each in a fresh process (2 runs). Raises the baseline's TrialFailure if either fails."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    t0 = time.monotonic()
    base = as_run(baseline, steps)
    order = base.seed if base.data_seed is None else base.data_seed
    losses, applied = train_run(base, folder / "baseline", timeout_s, server)
    twin, _ = train_run(base.replace(data_seed=order + 1), folder / "twin", timeout_s, server)
    return Reference(base, steps, losses, twin, time.monotonic() - t0, why_not_checkable(applied, losses, twin))


UNSEEDED = (
    "the baseline's run never seeded torch (no torch.manual_seed reached; a seed under a flag the script was "
    "not given counts as none), so no two runs start from the same weights and a loss comparison would compare "
    "two draws: seed it where the model is built, torch.manual_seed(at.seed(0))"
)
SAME_DATA = (
    "the data-order twin (data seed + 1) trained on the baseline's own batches{how}, so there is no data-order "
    "noise to set a tolerance by: draw the batches with a DataLoader that shuffles, or seed the script's own "
    "sampling with the trial's data seed, torch.Generator().manual_seed(at.data_seed(0))"
)


def why_not_checkable(applied: Mapping[str, Any], losses: Sequence[float], twin: Sequence[float]) -> str | None:
    """Why the baseline's run and its data-order twin cannot set a tolerance (UNSEEDED, SAME_DATA), from what
    the baseline's run recorded (a script's: whether it seeded torch, where the data seed reached) and
    whether the twin's losses differ at all; None: they can."""
    script = applied.get("script")
    if isinstance(script, Mapping) and script.get("seeded") is False:
        return UNSEEDED
    if isinstance(script, Mapping) and "data_order" in script and script["data_order"] is None:
        return SAME_DATA.format(how=" (the script calls no at.data_seed() and no DataLoader of it shuffles)")
    if tuple(losses) == tuple(twin):
        return SAME_DATA.format(how=": its losses are the baseline's, bitwise")
    return None


def check(
    candidate: TrialConfig,
    baseline: TrialConfig,
    steps: int,
    folder: Path,
    timeout_s: float,
    server: WarmServer | None = None,
    reference: Reference | None = None,
) -> ParityResult:
    """Train `candidate` against `baseline` (from noise_reference(), or measured here when None or too
    short) and judge it. Raises ValueError for a reference of another baseline."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if reference is not None and not same_training(reference.baseline, baseline):
        raise ValueError("the reference was measured for another baseline")
    t0 = time.monotonic()
    g_c, g_b = candidate.global_batch_size, baseline.global_batch_size
    samples = steps * max(g_c, g_b)
    c_steps, b_steps = steps_for(samples, g_c), steps_for(samples, g_b)
    grid = max(g_c, g_b)
    if reference is not None and reference.not_checkable:  # no candidate run: nothing could judge it
        return _not_checkable(reference, steps, samples, t0, c_steps, b_steps, 0)
    runs = 1
    try:
        losses = train_losses(as_run(candidate, c_steps), folder / "candidate", timeout_s, server)
    except TrialFailure as e:
        why = (str(e).strip().splitlines() or [""])[0][:200]
        noise = (
            reference_noise(reference, samples, grid)
            if reference is not None and reference.samples >= samples
            else None
        )
        return ParityResult(
            steps,
            samples,
            None,
            None if noise is None else tolerance_for(noise),
            noise,
            False,
            f"the candidate failed to train: {e.reason}" + (f": {why}" if why else ""),
            time.monotonic() - t0,
            c_steps,
            b_steps,
            runs,
            e.reason,
        )
    if reference is None or reference.samples < samples:
        reference = noise_reference(baseline, b_steps, folder / "reference", timeout_s, server)
        runs += 2
        if reference.not_checkable:
            return _not_checkable(reference, steps, samples, t0, c_steps, b_steps, runs)
    return judge(candidate, baseline, steps, losses, reference, time.monotonic() - t0, runs)


def judge(
    candidate: TrialConfig,
    baseline: TrialConfig,
    steps: int,
    losses: Sequence[float],
    reference: Reference,
    seconds: float = 0.0,
    runs: int = 0,
) -> ParityResult:
    """What the candidate's losses from its first step (at least candidate_steps(...) of them) show against a
    reference that covers the comparison (covers(...)): check()'s candidate run, or the losses a class's
    first trial recorded (search/checks/riding.py)."""
    g_c, g_b = candidate.global_batch_size, baseline.global_batch_size
    samples, grid = steps * max(g_c, g_b), max(g_c, g_b)
    c_steps, b_steps = steps_for(samples, g_c), steps_for(samples, g_b)
    dev = deviation(losses[:c_steps], g_c, reference.losses, g_b, samples, grid)
    noise = reference_noise(reference, samples, grid)
    tol = tolerance_for(noise)
    passed = dev <= tol
    reason = _reason(candidate, baseline, dev, tol, noise)
    return ParityResult(steps, samples, dev, tol, noise, passed, reason, seconds, c_steps, b_steps, runs)


def candidate_steps(candidate: TrialConfig, baseline: TrialConfig, steps: int) -> int:
    """The candidate's optimizer steps a check of `steps` compares (its own K at the larger global batch)."""
    g_c, g_b = candidate.global_batch_size, baseline.global_batch_size
    return steps_for(steps * max(g_c, g_b), g_c)


def covers(reference: Reference, candidate: TrialConfig, baseline: TrialConfig, steps: int) -> bool:
    """Whether `reference` spans the samples a check of `candidate` over `steps` compares."""
    return reference.samples >= steps * max(candidate.global_batch_size, baseline.global_batch_size)


def _not_checkable(
    reference: Reference, steps: int, samples: int, t0: float, c_steps: int, b_steps: int, runs: int
) -> ParityResult:
    why = f"not checkable: {reference.not_checkable}"
    return ParityResult(
        steps, samples, None, None, None, False, why, time.monotonic() - t0, c_steps, b_steps, runs,
        not_checkable=reference.not_checkable,
    )  # fmt: skip


def _reason(candidate: TrialConfig, baseline: TrialConfig, dev: float, tol: float, noise: float) -> str:
    g_c, g_b, passed = candidate.global_batch_size, baseline.global_batch_size, dev <= tol
    where = (
        ""
        if g_c == g_b
        else (
            f" at equal samples seen (global batch {g_b} -> {g_c}, lr {baseline.effective_lr:.3g}"
            f" -> {candidate.effective_lr:.3g})"
        )
    )
    rule = f"{FRACTION} x data-order noise {noise:.1%}" if tol > FLOOR else f"the floor; data-order noise {noise:.2%}"
    return (
        f"loss trajectory {'within' if passed else 'deviates'} {dev:.1%} {'of' if passed else 'from'} the "
        f"baseline's{where}, tolerance {tol:.1%} ({rule})"
    )


def steps_for(samples: float, global_batch: int) -> int:
    """Optimizer steps of `global_batch` samples that see at least `samples` (at least one)."""
    return max(1, math.ceil(samples / global_batch))


def as_run(cfg: TrialConfig, steps: int) -> TrialConfig:
    """The config as parity runs it: `steps` optimizer steps, all recorded, no warm-up, no time box."""
    return cfg.replace(
        warmup_steps=0, timed_steps=steps, seconds=None, profile=False, window=min(cfg.window, steps), record_steps=0
    )


def same_training(a: TrialConfig, b: TrialConfig) -> bool:
    """The same config, whatever the steps and measurement settings parity overrides."""
    return as_run(a, 1) == as_run(b, 1)


def train_losses(cfg: TrialConfig, trial_dir: Path, timeout_s: float, server: WarmServer | None) -> tuple[float, ...]:
    return train_run(cfg, trial_dir, timeout_s, server)[0]


def train_run(
    cfg: TrialConfig, trial_dir: Path, timeout_s: float, server: WarmServer | None
) -> tuple[tuple[float, ...], Mapping[str, Any]]:
    """A run's losses, one per step, and what it recorded it applied."""
    result, _ = locked_trial(cfg, trial_dir, timeout_s, server=server)
    if len(result.losses) != cfg.timed_steps:  # the worker records every step: anything else is a bug
        raise TrialFailure(f"{len(result.losses)} losses recorded for {cfg.timed_steps} steps")
    return tuple(result.losses), result.applied
