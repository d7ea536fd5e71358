"""search/loop/cost.py: a proposal's wall time to a result, scaled from the nearest measured trial (its
start-up, its warm-up's one-off part, its step time by the samples a step computes, its time around them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.search.loop import cost
from autotune.search.store.records import TrialRecord, write
from autotune.search.store.storage import open_storage

# The search's own workload: 3 warm-up steps, then at least a window of 5 steps and 15 s.
WORK = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=128, warmup_steps=3, seconds=15.0, window=5)


def timing(batch: int, sps: float, startup: float = 0.6, warmup: float | None = None, **extra: Any) -> dict[str, Any]:
    """What a trial of `batch` at `sps` samples/s records, its warm-up its 3 steps (by default)."""
    step = batch / sps
    return {
        "samples_per_s": sps,
        "startup_s": startup,
        "warmup_s": 3 * step if warmup is None else warmup,
        "timed_steps": max(5, int(-(-15 // step))),
        "world_size": 1,
        **extra,
    }


def study_of(tmp_path: Path, rows: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]) -> optuna.Study:
    """(role, knobs, metrics, record fields) per completed trial."""
    study = optuna.create_study(study_name="c", storage=open_storage(str(tmp_path / "s.db")), direction="maximize")
    for role, knobs, metrics, fields in rows:
        t = study.ask()
        write(t, TrialRecord(role=role, config=WORK.replace(**knobs).knobs(), metrics=metrics, **fields))
        study.tell(t, metrics["samples_per_s"])
    return study


def test_the_baselines_figures_predict_a_batch_64_trial_that_cannot_fit(tmp_path: Path) -> None:
    """The measured case: the baseline at 9 samples/s (batch 8), and batch 64 in bf16 proposed with 47 s
    left. A step of 64 is 8 of 8: 7.1 s; 3 warm-up steps and 5 timed ones (a window; 15 s is fewer)."""
    study = study_of(tmp_path, [("baseline", {}, timing(8, 9.0), {"wall_s": 0.6 + 3 * 8 / 9 + 17 * 8 / 9 + 0.5})])
    est = cost.estimate(WORK.replace(batch_size=64, precision="bf16"), cost.measurements(study, WORK))
    assert est is not None and est.source == 0
    step = 64 / 9
    assert est.step_s == pytest.approx(step)
    assert (est.warm_steps, est.timed_steps) == (3, 5)
    assert est.overhead_s == pytest.approx(0.5)  # its wall time less start-up, warm-up and 17 timed steps
    assert est.seconds == pytest.approx(0.6 + 8 * step + 0.5)
    assert est.seconds > 47 and "7.11 s a step" in est.figures() and "scaled from trial 0" in est.figures()


def test_nothing_measured_yet_is_no_estimate(tmp_path: Path) -> None:
    assert cost.estimate(WORK, []) is None
    contended = ("baseline", {}, timing(8, 9.0), {"contended": True})
    reused = ("search", {}, timing(8, 9.0), {"repeat_of": 0})
    assert cost.measurements(study_of(tmp_path, [contended, reused]), WORK) == []


def test_the_nearest_config_is_the_reference(tmp_path: Path) -> None:
    """The warm start (workers, bf16) differs from a bf16 batch-16 proposal only in its batch: its figures
    scale, not the baseline's, whose per-sample time is 3x slower."""
    study = study_of(
        tmp_path,
        [
            ("baseline", {}, timing(8, 4.0), {}),
            ("warm_start", {"precision": "bf16", "num_workers": 2, "prefetch_factor": 2}, timing(8, 12.0, 1.5), {}),
        ],
    )
    proposal = WORK.replace(precision="bf16", num_workers=2, prefetch_factor=2, batch_size=16)
    est = cost.estimate(proposal, cost.measurements(study, WORK))
    assert est is not None and est.source == 1 and est.startup_s == 1.5
    assert est.step_s == pytest.approx(16 / 12)
    assert est.warm_steps == 3 + 4  # the 2 workers x prefetch 2 batches made ahead are drained untimed


def test_two_measured_micro_batches_give_the_fixed_part_of_a_step(tmp_path: Path) -> None:
    """Batch 8 in 1.0 s, 16 in 1.5 s: 0.5 s fixed and 1/16 s a sample, so batch 32 takes 2.5 s, not the
    4 s proportion would give (a GPU not yet saturated)."""
    study = study_of(
        tmp_path, [("baseline", {}, timing(8, 8.0), {}), ("search", {"batch_size": 16}, timing(16, 16 / 1.5), {})]
    )
    est = cost.estimate(WORK.replace(batch_size=32), cost.measurements(study, WORK))
    assert est is not None and est.step_s == pytest.approx(2.5)


def test_compilations_one_off_time_counts_only_for_the_same_compile_mode(tmp_path: Path) -> None:
    compiled = timing(8, 8.0, warmup=3 * 1.0 + 40.0)  # 40 s of compilation on top of its 3 steps
    study = study_of(tmp_path, [("search", {"compile": "default"}, compiled, {})])
    measured = cost.measurements(study, WORK)
    same = cost.estimate(WORK.replace(compile="default", batch_size=16), measured)
    other = cost.estimate(WORK.replace(batch_size=16), measured)
    assert same is not None and other is not None
    assert same.warmup_s == pytest.approx(3 * 2.0 + 40.0) and other.warmup_s == pytest.approx(3 * 2.0)


def test_a_time_box_runs_at_least_its_seconds_and_a_window(tmp_path: Path) -> None:
    study = study_of(tmp_path, [("baseline", {}, timing(8, 80.0), {})])  # 0.1 s a step
    est = cost.estimate(WORK, cost.measurements(study, WORK))
    assert est is not None and est.timed_steps == 150 and est.timed_s == pytest.approx(15.0)
    counted = cost.estimate(WORK.replace(seconds=None, timed_steps=20), cost.measurements(study, WORK))
    assert counted is not None and counted.timed_steps == 20


def test_a_trial_that_carries_a_check_is_estimated_with_its_steps_past_the_window(tmp_path: Path) -> None:
    """Seen at README's 10 minutes: batch 4's first trial was to record the time-to-target cap (180 steps), was
    estimated at 18 s, ran past its 46 s timeout and left neither a figure nor a verdict. The steps past the
    window are in the estimate; and trial 0's own, past its window, are not taken for time around its steps."""
    wall = 0.6 + 3 * 8 / 9 + 17 * 8 / 9 + 0.5
    study = study_of(tmp_path, [("baseline", {}, timing(8, 9.0, record_s=12.0), {"wall_s": wall + 12.0})])
    measured = cost.measurements(study, WORK)
    assert measured[0].overhead_s == pytest.approx(0.5)  # not 12.5: the 12 s past the window were a check's
    plain = cost.estimate(WORK.replace(batch_size=4), measured)
    carrying = cost.estimate(WORK.replace(batch_size=4, record_steps=180), measured)
    assert plain is not None and carrying is not None and plain.record_s == 0.0
    step = 4 / 9
    past = 180 - plain.warm_steps - plain.timed_steps
    assert carrying.record_s == pytest.approx(past * step) and carrying.seconds == pytest.approx(
        plain.seconds + past * step
    )
    assert "of steps past them for a check" in carrying.figures()
    # a window that holds the steps adds nothing
    assert cost.estimate(WORK.replace(batch_size=4, record_steps=10), measured).record_s == 0.0  # type: ignore[union-attr]
