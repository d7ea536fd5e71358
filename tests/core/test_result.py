"""core/result.py: what a trial measured, through result.json and back."""

from __future__ import annotations

import math

from autotune.core.result import TrialResult


def test_trial_result_round_trip_and_loss_finite() -> None:
    r = TrialResult(
        status="ok",
        samples_per_s=10.0,
        loss_first=1.0,
        loss_last=0.5,
        windows=(9.0, 11.0),
        applied={"batch_size": {"requested": 2, "in_effect": 2}},
    )
    d = r.to_dict()
    assert d["loss_finite"] is True and d["windows"] == [9.0, 11.0]
    assert TrialResult.from_dict(d) == r
    assert not TrialResult(status="ok", loss_first=1.0, loss_last=math.nan).loss_finite
    assert not TrialResult(status="oom").loss_finite
    assert set(r.metrics()) >= {"samples_per_s", "step_time_p50", "data_wait_fraction", "peak_memory_bytes"}
