"""search/space/resolve.rebased: the study's baseline takes the batch trial 0's run reported as the script's
own, whenever the baseline did not record that one, autotune's default 8 included."""

from __future__ import annotations

from typing import Any

from autotune.core.config import TrialConfig
from autotune.search.space.resolve import rebased

SPEC = "script:train.py --batch_size=8"


def _applied(batch: Any) -> dict[str, Any]:
    own = {"batch_size": batch, "accumulation": 1, "from": "at.batch_size()'s default as the run handed it over"}
    return {"script": {"own": own, "api_calls": {"batch_size": 1}}}


def test_a_batch_the_source_could_not_say_is_recorded_even_at_autotune_s_default() -> None:
    base = TrialConfig(pipeline=SPEC)  # the source could not say: no batch in the baseline
    got = rebased(base, _applied(8))
    assert got is not None and dict(got.baseline or ())["batch_size"] == 8
    assert rebased(base, _applied(6)) is not None and dict(rebased(base, _applied(6)).baseline or ())["batch_size"] == 6


def test_nothing_to_rebase_when_the_baseline_says_it_or_the_run_reported_none() -> None:
    told = TrialConfig(pipeline=SPEC, baseline={"batch_size": 8})
    assert rebased(told, _applied(8)) is None
    assert rebased(TrialConfig(pipeline=SPEC), {"script": {"own": None}}) is None  # a script with no batch
    assert rebased(TrialConfig(pipeline=SPEC), {}) is None
    assert rebased(TrialConfig(pipeline=SPEC, global_batch=32), _applied(8)) is None  # the study fixes it
