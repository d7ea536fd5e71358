"""Time to target: is a config that changes the optimizer step (the global batch, and so the lr) worth
adopting? MLPerf's question: how long until training reaches the quality the baseline reaches.

Parity (search/checks/parity.py) compares loss at equal samples seen. A larger batch makes fewer optimizer
steps per sample, so early in training its loss at equal samples is almost always higher, and parity
fails nearly every batch change, including one that reaches the same loss sooner in wall time. So a
config whose step differs is judged here instead:

* The target is the baseline's smoothed loss after its K reference steps (the parity reference, measured
  once per study and stored: K = --parity-steps).
* The candidate trains from the same initial weights on the same data order for up to CAP x the
  baseline's samples. The first sample count at which its smoothed loss is at or below the target is
  its samples to target; the baseline's own is found the same way on its trajectory.
* Time to target = samples to target / samples/s (the confirmed medians when the rounds measured them,
  else the search's figures). speedup to target = the baseline's time / the candidate's.
* It passes when that speedup is above 1 and, once there, its smoothed loss stays within the parity
  tolerance (the data-order noise) above the target to the end of its run: no divergence.
* A target too thin to tell is no check: the baseline must reach it after at least MIN_STEPS of its
  optimizer steps, and its loss must fall to it by more than the tolerance. Below that the class is "not
  checked" (never a pass), decided from the stored reference before the candidate trains: a target
  reached within a step or two passed a batch change at "1.91x sooner" on one draw of the baseline.

Smoothing is a trailing mean over the same span of samples for both runs, SMOOTH baseline steps (a
larger batch's single step already averages over more samples).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialFailure
from autotune.core.outcomes import Verdict
from autotune.search.store.records import CheckRecord
from autotune.search.checks.parity import SMOOTH, Reference, as_run, steps_for, tolerance_for, train_losses
from autotune.trial.processes.warm_client import WarmServer

# The candidate's run is capped at CAP x the baseline's samples. On the held-out study the configs that
# changed the step ran at x1.94-x2.17 the baseline's samples/s on a 2-CPU machine and x4.6-x6.1 on an
# H200: a config that needs more than 3x the samples could only win above x3 throughput, which no CPU
# config reached, and 3x keeps the check's cost at about 3 baseline reference runs of samples, done at
# the candidate's higher speed. A larger cap would mostly buy checks that fail anyway.
CAP = 3.0
# The fewest baseline optimizer steps before its target that make samples to target a measurement.
MIN_STEPS = 5


@dataclass(frozen=True)
class TargetResult:
    """What one time-to-target check found; stored as its CheckRecord (to_dict)."""

    target: float  # the baseline's smoothed loss after its reference steps
    baseline_samples: int | None  # samples the baseline needed to reach it (None: never, by noise)
    samples: int | None  # samples the candidate needed (None: not within the cap)
    cap_samples: int
    speedup: float | None  # speedup to target; None when the candidate never reached it
    passed: bool
    reason: str
    seconds: float
    tolerance: float
    failure: str | None = None
    checkable: bool = True  # False: the target is too thin to tell (never a pass, never a fail)

    def to_dict(self) -> CheckRecord:
        verdict = Verdict.NOT_CHECKED if not self.checkable else Verdict.PASS if self.passed else Verdict.FAIL
        d: CheckRecord = {
            "kind": "time to target",
            "verdict": verdict,
            "reason": self.reason,
            "target_loss": round(self.target, 6),
            "baseline_samples_to_target": self.baseline_samples,
            "samples_to_target": self.samples,
            "cap_samples": self.cap_samples,
            "speedup_to_target": None if self.speedup is None else round(self.speedup, 3),
            "tolerance": round(self.tolerance, 6),
            "seconds": round(self.seconds, 1),
            "rule": f"reach the baseline's loss after its reference steps within {CAP:g}x its samples, sooner in "
            f"wall time, then stay within the data-order tolerance; trailing mean over {SMOOTH} baseline steps",
        }
        if self.failure is not None:
            d["failure"] = self.failure
        return d


def smoothed_curve(losses: Sequence[float], per_step: int, span: int) -> list[tuple[int, float]]:
    """(samples seen, the mean loss of the steps that ended within the last `span` samples) at each step end."""
    out = []
    for i in range(len(losses)):
        x = (i + 1) * per_step
        window = [loss for j, loss in enumerate(losses) if x - span < (j + 1) * per_step <= x] or [losses[i]]
        out.append((x, sum(window) / len(window)))
    return out


def samples_to(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first sample count at which the smoothed loss is at or below `target`."""
    return next((x for x, loss in curve if loss <= target), None)


def thin(reference: Reference) -> str | None:
    """Why the reference's target cannot tell a candidate's time to it (None: it can): the baseline reaches
    it within fewer than MIN_STEPS steps, or its loss falls to it by no more than the tolerance."""
    g_b = reference.baseline.global_batch_size
    curve = smoothed_curve(reference.losses, g_b, SMOOTH * g_b)
    target = curve[-1][1]
    steps = (samples_to(curve, target) or reference.samples) // g_b
    if steps < MIN_STEPS:
        return (
            f"not checkable: the target (the baseline's loss {target:.4g}) is reached within {steps} of its "
            f"steps; at least {MIN_STEPS} tell (--parity-steps sets how far the baseline trains)"
        )
    drop, tol = (reference.losses[0] - target) / abs(target or 1.0), tolerance_for(reference.noise)
    if drop <= tol:
        return (
            f"not checkable: the baseline's loss falls {drop:.1%} to the target {target:.4g}, within its noise "
            f"{tol:.1%} (--parity-steps sets how far it trains)"
        )
    return None


def judge(
    losses: Sequence[float],
    candidate_batch: int,
    reference: Reference,
    candidate_sps: float,
    baseline_sps: float,
    seconds: float = 0.0,
) -> TargetResult:
    """What a candidate's trajectory (capped run) shows against the stored reference."""
    g_b = reference.baseline.global_batch_size
    span = SMOOTH * g_b
    base_curve = smoothed_curve(reference.losses, g_b, span)
    target = base_curve[-1][1]
    tol = tolerance_for(reference.noise)
    base_n = samples_to(base_curve, target) or reference.samples
    curve = smoothed_curve(losses, candidate_batch, span)
    cap = len(losses) * candidate_batch
    n = samples_to(curve, target)
    if n is None:
        low = min(v for _, v in curve)
        return TargetResult(
            target,
            base_n,
            None,
            cap,
            None,
            False,
            f"did not reach the baseline's loss {target:.4g} within {cap} samples "
            f"({cap / reference.samples:.1f}x the baseline's; its lowest was {low:.4g})",
            seconds,
            tol,
        )
    speedup = (base_n / baseline_sps) / (n / candidate_sps) if candidate_sps > 0 and baseline_sps > 0 else 0.0
    worst = max(v for x, v in curve if x >= n)
    diverged = worst > target * (1 + tol)
    passed = speedup > 1 and not diverged
    reason = (
        f"reached the baseline's loss {target:.4g} after {n} samples (the baseline {base_n}), "
        f"{speedup:.2f}x sooner in wall time at {candidate_sps:.3g} vs {baseline_sps:.3g} samples/s"
    )
    if diverged:
        reason += f"; then rose to {worst:.4g}, beyond the tolerance {tol:.1%} above it"
    elif speedup <= 1:
        reason += ": not sooner than the baseline"
    return TargetResult(target, base_n, n, cap, speedup, passed, reason, seconds, tol)


def check(
    candidate: TrialConfig,
    reference: Reference,
    folder: Path,
    timeout_s: float,
    candidate_sps: float,
    baseline_sps: float,
    server: WarmServer | None = None,
) -> TargetResult:
    """Train `candidate` for up to CAP x the reference's samples from the same weights and data order, and
    judge it. A candidate that fails to train fails, naming why."""
    t0 = time.monotonic()
    g_c = candidate.global_batch_size
    steps = steps_for(CAP * reference.samples, g_c)
    why = thin(reference)
    if why is not None:
        return TargetResult(0.0, None, None, 0, None, False, why, 0.0, tolerance_for(reference.noise), checkable=False)
    try:
        losses = train_losses(as_run(candidate, steps), folder / "candidate", timeout_s, server)
    except TrialFailure as e:
        why = (str(e).strip().splitlines() or [""])[0][:200]
        return TargetResult(
            0.0,
            None,
            None,
            steps * g_c,
            None,
            False,
            f"the candidate failed to train: {e.reason}" + (f": {why}" if why else ""),
            time.monotonic() - t0,
            tolerance_for(reference.noise),
            e.reason,
        )
    return judge(losses, g_c, reference, candidate_sps, baseline_sps, time.monotonic() - t0)


def cost_samples(candidate: TrialConfig, reference_samples: int) -> int:
    """The samples a check of `candidate` trains: its capped run."""
    g_c = candidate.global_batch_size
    return steps_for(CAP * reference_samples, g_c) * g_c
