"""autotune/apply/comparison.py: what `train --compare-baseline` says of a config's run against the baseline's."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.apply.comparison import compare, paired, time_to


def _run(iou: float | None, steps: int, batch: int, history: list[dict] | None = None) -> dict:
    history = history or [{"epoch": 1, "seconds": 1.0, "samples": 10, "loss": 0.5, "iou": iou}]
    return {
        "samples_per_s": 10.0,
        "steady_samples_per_s": None,
        "optimizer_steps": steps,
        "global_batch": batch,
        "lr": 1e-3,
        "iou": iou,
        "history": history,
    }


def test_compare_says_each_sides_time_to_the_baselines_final_iou() -> None:
    """MLPerf's question: a larger batch that is behind after epoch 1 may still reach the quality sooner."""

    def hist(seconds: float, ious: list[float]) -> list[dict]:
        return [
            {"epoch": i + 1, "seconds": seconds, "samples": 96, "loss": 1 - v, "iou": v} for i, v in enumerate(ious)
        ]

    tuned = _run(0.86, 15, 32, hist(4.0, [0.60, 0.80, 0.85, 0.86, 0.86]))  # reaches 0.85 at epoch 3: 12 s
    base = _run(0.85, 60, 8, hist(10.0, [0.70, 0.80, 0.83, 0.85, 0.85]))  # at epoch 4: 40 s
    lines = compare(tuned, base, epochs=5, margin=0.05)
    line = next(x for x in lines if x.startswith("time to the baseline's final IoU 0.8500"))
    assert "config 12.0 s (epoch 3), baseline 40.0 s (epoch 4): x3.33" in line
    assert tuned["comparison"]["speedup_to_target"] == pytest.approx(40 / 12)
    assert time_to(hist(1.0, [0.1, 0.2]), "iou", 0.5) is None
    assert time_to(hist(1.0, [0.1, 0.2]), "loss", 0.85) == (2.0, 2)  # loss is reached from above
    slow = compare(_run(0.5, 15, 32, hist(4.0, [0.4, 0.5])), base, 2, 0.05)
    assert any("config not reached in 2 epoch(s)" in x for x in slow)


def test_the_speedup_after_the_first_epoch_is_said_beside_the_whole_runs() -> None:
    from autotune.apply.train import _rate  # imports torch: only here

    # Measured on an H200: the config's first epoch paid 9.8 s of one-off start-up (cudnn.benchmark's
    # autotuning, 8 loader workers), so 3 short epochs made it x0.40 while epochs 2-3 ran x2.9.
    tuned_h = [{"samples": 115, "seconds": 9.79}, {"samples": 115, "seconds": 0.37}, {"samples": 115, "seconds": 0.39}]
    base_h = [{"samples": 115, "seconds": 1.99}, {"samples": 115, "seconds": 1.08}, {"samples": 115, "seconds": 1.15}]
    tuned, base = (
        dict(_run(0.66, 24, 16), history=h, samples_per_s=_rate(h), steady_samples_per_s=_rate(h[1:]))
        for h in (tuned_h, base_h)
    )
    lines = compare(tuned, base, epochs=3, margin=0.05)
    assert lines[0].startswith("speedup: x0.40")
    assert lines[1].startswith("speedup after the first epoch: x2.93") and "config 9.79 s, baseline 1.99 s" in lines[1]
    assert tuned["comparison"]["speedup_after_first_epoch"] == pytest.approx(2.934, abs=1e-3)
    assert _rate([]) is None and "after the first epoch" not in " ".join(
        compare(_run(0.5, 5, 8), _run(0.5, 5, 8), 1, 0.05)
    )


def test_a_config_behind_the_baseline_says_so_in_one_line_and_in_the_record() -> None:
    tuned, base = _run(0.10, 5, 64), _run(0.84, 50, 8)
    lines = compare(tuned, base, epochs=5, margin=0.02)
    assert "optimizer steps: config 5 (global batch 64" in lines[1] and "baseline 50 (global batch 8" in lines[1]
    warning = [line for line in lines if "WARNING" in line]
    assert len(warning) == 1 and "0.7400 behind" in warning[0] and "--global-batch 8" in warning[0]
    assert {k: v for k, v in tuned["comparison"].items() if k != "time_to_target"} == {
        "speedup": 1.0,
        "speedup_after_first_epoch": None,
        "iou_difference": pytest.approx(-0.74),
        "margin": 0.02,
        "behind_baseline": True,
    }
    numerics = compare(_run(0.70, 50, 8), base, 5, 0.02)  # the same step: the advice is about numerics
    assert any("WARNING" in line and "--global-batch" not in line and "precision" in line for line in numerics)
    close = _run(0.83, 50, 8)
    assert not any("WARNING" in line for line in compare(close, base, 5, 0.02))  # within the margin
    assert close["comparison"]["behind_baseline"] is False


def _side(sps: float, to_target: float | None = None) -> dict[str, Any]:
    return {"samples_per_s": sps, "comparison": {} if to_target is None else {"speedup_to_target": to_target}}


def test_paired_rounds_whose_interval_holds_one_are_no_measurable_gain() -> None:
    # x1.2, x0.9, x1.1: the median says faster, the sign test's interval cannot tell it from the baseline.
    summary, lines = paired([(_side(12.0), _side(10.0)), (_side(9.0), _side(10.0)), (_side(11.0, 1.3), _side(10.0))])
    assert summary["speedups"] == pytest.approx([1.2, 0.9, 1.1]) and summary["speedup_median"] == pytest.approx(1.1)
    assert summary["speedup_range"] == pytest.approx([0.9, 1.2]) and not summary["measurable"]
    assert summary["interval"] == pytest.approx([0.9, 1.2]) and summary["coverage"] == 0.75
    assert summary["speedup_to_target"] == [1.3]  # only the round that reached the target
    assert lines[-1] == (
        "verdict: no measurable gain over the baseline on this machine: x1.10 (x0.90..x1.20, 75% sign-test "
        "interval, 3 rounds) holds x1.00"
    )
    assert "1 of 3 rounds" in lines[1]


def test_paired_rounds_say_faster_only_from_three_rounds_with_an_interval_clear_of_one() -> None:
    two, lines = paired([(_side(13.0), _side(10.0)), (_side(14.0), _side(10.0))])
    # Faster in both rounds, yet two rounds are no interval: "faster in every round" came out x1.07 alone.
    assert not two["measurable"] and two["direction"] is None
    assert lines[-1].startswith("verdict: no measurable gain yet: x1.35 (x1.30..x1.40, 50% sign-test interval")
    three, lines = paired([(_side(13.0), _side(10.0)), (_side(14.0), _side(10.0)), (_side(12.0), _side(10.0))])
    assert three["measurable"] and three["interval"] == pytest.approx([1.2, 1.4])
    assert lines[-1] == "verdict: faster than the baseline: x1.30 (x1.20..x1.40, 75% sign-test interval, 3 rounds)"
    slower, lines = paired([(_side(8.0), _side(10.0)), (_side(9.0), _side(10.0)), (_side(8.5), _side(10.0))])
    assert slower["direction"] == "slower" and not slower["measurable"] and "slower than the baseline" in lines[-1]
    one, lines = paired([(_side(13.0), _side(10.0))])
    assert not one["measurable"] and "--rounds 3 or more" in lines[-1]  # one pair is never a verdict
