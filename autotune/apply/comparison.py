"""`autotune train --compare-baseline`'s verdict: the config's run against the baseline's, in speed, in
optimizer steps, in time to the baseline's final metric (MLPerf's question) and in the final metric;
over several rounds, each round's ratios, their median with the sign test's interval for it
(core/paired.py), and whether that interval can tell the config from the baseline at all."""

from __future__ import annotations

import statistics
from typing import Any

from autotune.core.paired import MIN_ROUNDS, Paired

# How far the config's final metric may fall behind the baseline's (absolute IoU) before train says so.
# Three baseline runs that differ only in data order (96 images at 96 px, 5 epochs) ended at IoU 0.619,
# 0.638 and 0.634: 0.019 apart at most. 0.05 is 2.5x that, so natural noise does not trip it.
METRIC_MARGIN = 0.05


def time_to(history: list[dict[str, Any]], key: str, target: float) -> tuple[float, int] | None:
    """(training seconds until the end of the first epoch whose `key` reached `target`, that epoch), or
    None when none did. IoU is reached from below, loss from above. Validation time is not counted."""
    elapsed = 0.0
    for rec in history:
        elapsed += rec["seconds"]
        value = rec.get(key)
        if value is not None and (value >= target if key == "iou" else value <= target):
            return elapsed, rec.get("epoch", 0)
    return None


def _time_to_target_line(tuned: dict[str, Any], base: dict[str, Any]) -> str:
    """MLPerf's question for a run: the wall time each side took to reach the baseline's final IoU (or its
    final loss, for a pipeline without a metric), recorded in `comparison`."""
    key = "iou" if tuned["iou"] is not None and base["iou"] is not None else "loss"
    target = base["iou"] if key == "iou" else base["history"][-1]["loss"]
    mine, theirs = time_to(tuned["history"], key, target), time_to(base["history"], key, target)
    what = f"the baseline's final {'IoU' if key == 'iou' else 'loss'} {target:.4f}"
    tuned["comparison"]["time_to_target"] = {
        "metric": key,
        "target": target,
        "config_s": mine and mine[0],
        "baseline_s": theirs and theirs[0],
    }
    if mine is None or theirs is None:
        return f"time to {what}: config not reached in {len(tuned['history'])} epoch(s)"
    tuned["comparison"]["speedup_to_target"] = theirs[0] / mine[0]
    return (
        f"time to {what}: config {mine[0]:.1f} s (epoch {mine[1]}), baseline {theirs[0]:.1f} s "
        f"(epoch {theirs[1]}): x{theirs[0] / mine[0]:.2f}"
    )


def compare(tuned: dict[str, Any], base: dict[str, Any], epochs: int, margin: float) -> list[str]:
    """The lines that compare the config's run with the baseline's; records `comparison` in `tuned`."""
    speedup = tuned["samples_per_s"] / base["samples_per_s"]
    steady = (
        tuned["steady_samples_per_s"] / base["steady_samples_per_s"]
        if tuned.get("steady_samples_per_s") and base.get("steady_samples_per_s")
        else None
    )
    tuned["comparison"] = {"speedup": speedup, "speedup_after_first_epoch": steady}
    lines = [
        f"speedup: x{speedup:.2f}  (config {tuned['samples_per_s']:.2f} "
        f"vs baseline {base['samples_per_s']:.2f} samples/s over {epochs} epoch(s), data loading included)"
    ]
    if steady is not None:
        first = tuned["history"][0]["seconds"], base["history"][0]["seconds"]
        lines.append(
            f"speedup after the first epoch: x{steady:.2f}  (config {tuned['steady_samples_per_s']:.2f} vs "
            f"baseline {base['steady_samples_per_s']:.2f} samples/s; the first epoch, with its one-off "
            f"start-up, took config {first[0]:.2f} s, baseline {first[1]:.2f} s)"
        )
    lines += [
        f"optimizer steps: config {tuned['optimizer_steps']} (global batch {tuned['global_batch']}, lr "
        f"{tuned['lr']:.3g}), baseline {base['optimizer_steps']} (global batch {base['global_batch']}, lr "
        f"{base['lr']:.3g})"
    ]
    lines.append(_time_to_target_line(tuned, base))
    if tuned["iou"] is None or base["iou"] is None:
        return lines + ["final IoU: not measured (no validation set or metric)"]
    diff = tuned["iou"] - base["iou"]
    behind = diff < -margin
    tuned["comparison"].update(iou_difference=diff, margin=margin, behind_baseline=behind)
    lines.append(f"final IoU: config {tuned['iou']:.4f}, baseline {base['iou']:.4f}, difference {diff:+.4f}")
    if behind:
        if tuned["global_batch"] != base["global_batch"]:
            fix = (
                f"its optimizer step differs (global batch {base['global_batch']} -> {tuned['global_batch']}): "
                f"search with --global-batch {base['global_batch']} to keep the baseline's"
            )
        else:  # the same optimizer step: precision or batch-norm span (best.yaml's training_math says which)
            fix = (
                "it takes the baseline's optimizer step, so the difference is its numerics (precision, "
                "batch-norm span: see training_math in best.yaml); train longer to see whether it closes, "
                "or keep those knobs at the baseline's in a --space file"
            )
        lines.append(
            f"autotune: WARNING: the config's IoU is {-diff:.4f} behind the baseline's, more than the "
            f"{margin} margin: {fix}"
        )
    return lines


def paired(rounds: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """The rounds' (config, baseline) runs summed up: each round's speedup (and speedup to the baseline's
    target, where both reached it), their median, range and the sign test's interval for the median. On a
    machine whose per-process speed drifts by ~10%, one pair is one draw: "faster" (or "slower") only
    from 3 rounds with an interval that excludes x1.00, else "no measurable gain"."""
    ratios = [tuned["samples_per_s"] / base["samples_per_s"] for tuned, base in rounds]
    to_target = [
        t["comparison"]["speedup_to_target"] for t, _ in rounds if "speedup_to_target" in t.get("comparison", {})
    ]
    p = Paired.of(ratios)
    low, high = min(ratios), max(ratios)
    summary = {
        "rounds": len(rounds),
        "speedups": ratios,
        "speedup_median": p.median,
        "speedup_range": [low, high],
        "interval": list(p.interval),
        "coverage": p.coverage,
        "direction": p.direction,  # faster | slower | None: the rounds cannot tell
        "measurable": p.measurable,  # a gain: faster, by the interval
        "verdict": p.statement(),
        "speedup_to_target": to_target,
    }
    lines = [
        f"paired rounds: {len(rounds)} (the two sides alternated, each run a fresh process): speedup median "
        f"x{p.median:.2f}, range x{low:.2f}..x{high:.2f} (each round: {', '.join(f'x{r:.2f}' for r in ratios)})"
    ]
    if to_target:
        lines.append(
            f"time to the baseline's target, each round it was reached: median x{statistics.median(to_target):.2f}, "
            f"range x{min(to_target):.2f}..x{max(to_target):.2f} ({len(to_target)} of {len(rounds)} rounds)"
        )
    tail = (
        f"; --rounds {MIN_ROUNDS} or more says whether the gap is more than the noise"
        if len(rounds) < MIN_ROUNDS
        else ""
    )
    lines.append(f"verdict: {p.statement()}{tail}")
    return summary, lines
