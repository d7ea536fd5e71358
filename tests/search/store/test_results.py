"""search/store/results.py: which trials count, their export order, and the best as an Export."""

from __future__ import annotations

import statistics
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.configfile import to_yaml
from autotune.search.store import records, results
from autotune.search.store.records import CONFIRMATION, PARITY, TrialRecord, write
from autotune.search.store.results import (
    baseline_knobs,
    best_export,
    export_order,
    exported,
    gain_statement,
    to_target_factor,
)
from autotune.search.store.storage import open_storage

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1)


def study_with(
    tmp_path: Path,
    rows: list[tuple[str, dict, float]],
    math: dict[int, tuple[str, ...]] | None = None,
    speedups: bool = False,
    applied: dict[int, dict] | None = None,
) -> optuna.Study:
    """A study of these (role, knobs, samples/s) trials; `speedups`: each records its speedup over the first's."""
    study = optuna.create_study(
        study_name="c", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize"
    )
    for i, (role, knobs, value) in enumerate(rows):
        t = study.ask()
        write(
            t,
            TrialRecord(
                role=role,
                config=TINY.replace(**knobs).knobs(),
                metrics={"samples_per_s": value},
                training_math=(math or {}).get(i),
                speedup=value / rows[0][2] if speedups else None,
                applied=(applied or {}).get(i, {}),
            ),
        )
        t.set_constraint("infeasible", 0.0)
        study.tell(t, value)
    return study


def test_without_confirmation_best_yaml_has_no_confirmed_section(tmp_path: Path) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 2}, 30.0)])
    exported = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert "confirmed" not in exported and exported["speedup"] == pytest.approx(3.0)


def test_a_config_the_rounds_measured_slower_than_the_baseline_is_not_exported(tmp_path: Path) -> None:
    """Seen as a new user: the warm start x1.05 in the search, x0.95 beside the baseline in the rounds, was
    exported. The rounds' order is the truth: below the baseline, the baseline is exported."""
    study = study_with(
        tmp_path,
        [("baseline", {}, 5.18), ("warm_start", {"num_workers": 2}, 5.44), ("search", {"batch_size": 4}, 5.30)],
    )
    study.set_user_attr(
        CONFIRMATION,
        {
            "rows": [
                {
                    "label": "trial 1",
                    "trial": 1,
                    "samples_per_s_median": 5.26,
                    "samples": [5.26],
                    "speedup_median": 0.95,
                },
                {
                    "label": "baseline",
                    "trial": 0,
                    "samples_per_s_median": 5.53,
                    "samples": [5.53],
                    "speedup_median": 1.0,
                },
            ]
        },
    )
    assert [t.number for t in export_order(study)] == [2, 0, 1]  # unconfirmed 2 keeps its place above the baseline
    study.set_user_attr(
        CONFIRMATION,
        {
            "rows": [
                {
                    "label": "trial 1",
                    "trial": 1,
                    "samples_per_s_median": 5.26,
                    "samples": [5.26],
                    "speedup_median": 0.95,
                },
                {
                    "label": "trial 2",
                    "trial": 2,
                    "samples_per_s_median": 5.00,
                    "samples": [5.00],
                    "speedup_median": 0.90,
                },
                {
                    "label": "baseline",
                    "trial": 0,
                    "samples_per_s_median": 5.53,
                    "samples": [5.53],
                    "speedup_median": 1.0,
                },
            ]
        },
    )
    assert [t.number for t in export_order(study)] == [0, 1, 2] and exported(study).number == 0


def test_an_unchecked_change_of_the_optimizer_step_is_never_exported(tmp_path: Path) -> None:
    """Its samples/s says nothing of how soon it reaches the baseline's quality: with the checks on, a larger
    batch whose time to target was not measured gives way to the best config that keeps the step."""
    study = study_with(
        tmp_path,
        [("baseline", {}, 10.0), ("search", {"batch_size": 32}, 20.0), ("search", {"num_workers": 1}, 12.0)],
        math={0: (), 1: ("global batch 8 -> 32", "lr 0.001 -> 0.002 (sqrt rule)"), 2: ()},
    )
    assert exported(study).number == 2  # parity off: nothing is checked, the fastest that keeps the math
    study.set_user_attr(PARITY, {"1": {"verdict": "not checked"}, "2": {"verdict": "not checked"}})
    assert exported(study).number == 2
    study.set_user_attr(PARITY, {"1": {"verdict": "pass"}})
    assert exported(study).number == 1


@pytest.mark.parametrize(
    "ratios, says",
    [
        (
            [0.92, 1.07, 1.01],
            "no measurable gain over the baseline on this machine: x1.01 (x0.92..x1.07, 75% sign-test interval, 3 rounds) holds x1.00",
        ),
        ([1.02, 1.30, 1.10], "faster than the baseline: x1.10 (x1.02..x1.30, 75% sign-test interval, 3 rounds)"),
        (
            [0.80, 0.95],
            "no measurable gain yet: x0.88 (x0.80..x0.95, 50% sign-test interval, 2 rounds); at least 3 paired rounds decide",
        ),
        (
            [1.59],
            "no measurable gain yet: x1.59 (x1.59..x1.59, 0% sign-test interval, 1 round); at least 3 paired rounds decide",
        ),
    ],
)
def test_the_confirmed_speedup_says_whether_its_rounds_tell_it_from_the_baseline(
    ratios: list[float], says: str
) -> None:
    assert gain_statement({"ratios": ratios}) == says


def _confirmed(study: optuna.Study, ratios: dict[int, list[float]]) -> None:
    """A confirmation summary with these per-round ratios to the baseline (figures: the baseline at 10)."""
    rows = [
        {
            "label": f"trial {n}",
            "trial": n,
            "search_samples_per_s": 10.0 * max(rs),
            "samples": [10.0 * r for r in rs],
            "samples_per_s_median": 10.0 * statistics.median(rs),
            "min": 10.0 * min(rs),
            "max": 10.0 * max(rs),
            "ratios": rs,
            "speedup_median": statistics.median(rs),
            "speedup_range": [min(rs), max(rs)],
        }
        for n, rs in ratios.items()
    ]
    rounds = max(len(rs) for rs in ratios.values())
    base = {
        "label": "baseline",
        "trial": 0,
        "search_samples_per_s": 10.0,
        "samples": [10.0] * rounds,
        "samples_per_s_median": 10.0,
        "min": 10.0,
        "max": 10.0,
        "ratios": [1.0] * rounds,
        "speedup_median": 1.0,
        "speedup_range": [1.0, 1.0],
    }
    study.set_user_attr(
        CONFIRMATION,
        {
            "rounds": rounds,
            "baseline_median": 10.0,
            "rows": [*rows, base],
            "winner": max(ratios, key=lambda n: statistics.median(ratios[n])),
            "order_changed": False,
            "search_order": [f"trial {n}" for n in ratios],
            "confirmed_order": [f"trial {n}" for n in ratios],
        },
    )


def test_two_rounds_faster_in_both_do_not_export_a_change(tmp_path: Path) -> None:
    """Seen on a user's script: 2 rounds "faster in every round" exported x1.30 that came out x1.07 alone.
    Two rounds are no interval at all: the export is the baseline, the faster config named beside it."""
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 2}, 13.0)], math={0: (), 1: ()})
    _confirmed(study, {1: [1.30, 1.23]})
    assert exported(study).number == 0
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 0 and best["config"]["num_workers"] == TINY.num_workers
    assert best["confirmed"]["verdict"].startswith("no change exported")
    (named,) = best["passed_over"]
    assert named["trial"] == 1 and "at least 3 paired rounds decide" in named["why"]


def test_an_interval_holding_one_exports_the_baseline_with_the_faster_one_named(tmp_path: Path) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 2}, 13.0)], math={0: (), 1: ()})
    _confirmed(study, {1: [1.30, 0.98, 1.20]})  # median x1.20, but one round slower than the baseline
    assert exported(study).number == 0
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    (named,) = best["passed_over"]
    assert named["trial"] == 1 and named["speedup"] == pytest.approx(1.2)
    assert "holds x1.00" in named["why"] and "75% sign-test interval, 3 rounds" in named["why"]
    # The same config faster in each of 3 rounds: a gain, stated with its interval and coverage.
    _confirmed(study, {1: [1.30, 1.10, 1.20]})
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 1 and "passed_over" not in best
    confirmed = best["confirmed"]
    assert confirmed["interval"] == pytest.approx([1.10, 1.30]) and confirmed["coverage"] == pytest.approx(0.75)
    assert confirmed["verdict"] == "faster than the baseline: x1.20 (x1.10..x1.30, 75% sign-test interval, 3 rounds)"


def test_a_config_whose_math_differs_and_was_not_checked_is_never_exported(tmp_path: Path) -> None:
    """A precision change the budget left no time to check was exported with "parity not checked"; the
    README promises the winner is checked first. The best checked config is exported, the faster
    unchecked one named beside it, whether the check did not fit or parity was off."""
    study = study_with(
        tmp_path,
        [
            ("baseline", {}, 10.0),
            ("search", {"precision": "bf16"}, 20.0),
            ("search", {"num_workers": 2}, 13.0),
            ("search", {"precision": "bf16", "num_workers": 1}, 12.0),
        ],
        math={0: (), 1: ("precision fp32 -> bf16",), 2: (), 3: ("precision fp32 -> bf16",)},
    )
    for checks in ({}, {"1": {"verdict": "not checked", "reason": "the budget left was shorter than the check"}}):
        study.set_user_attr(PARITY, checks)
        assert exported(study).number == 2
        best = yaml.safe_load(to_yaml(best_export(study, None, None)))
        assert best["study"]["trial"] == 2
        (named,) = [p for p in best["passed_over"] if p["trial"] == 1]
        assert "precision fp32 -> bf16" in named["why"] and "not checked" in named["why"]
    study.set_user_attr(PARITY, {"1": {"verdict": "fail", "reason": "deviates"}, "3": {"verdict": "pass"}})
    assert exported(study).number == 2  # the faster config of the baseline's math needs no check to go first
    (tmp_path / "2").mkdir()
    study2 = study_with(
        tmp_path / "2",
        [
            ("baseline", {}, 10.0),
            ("search", {"precision": "bf16", "num_workers": 1}, 14.0),
            ("search", {"num_workers": 2}, 13.0),
        ],
        math={0: (), 1: ("precision fp32 -> bf16",), 2: ()},
    )
    study2.set_user_attr(PARITY, {"1": {"verdict": "pass"}})
    assert exported(study2).number == 1  # a differs-math config that passed its check, and faster, is exported


def test_the_faster_of_two_confirmed_configs_of_a_passed_class_is_exported(tmp_path: Path) -> None:
    """The README's 10-minute search: two configs of one class (global batch 16 with bf16), whose time to
    target passed at trial 4, confirmed at x1.95 (trial 5) and x1.82 (trial 6); trial 6, the slower, was
    exported, since each trial's to-target factor was the class's speedup over its own search figure. The
    factor is the class's (samples to target), so the confirmed figures decide within the class."""
    math = ("global batch 8 -> 16", "precision fp32 -> bf16")
    study = study_with(
        tmp_path,
        [
            ("baseline", {}, 10.0),
            ("search", {"batch_size": 16, "precision": "bf16"}, 19.0),
            ("search", {"batch_size": 16, "precision": "bf16", "num_workers": 1}, 17.0),
        ],
        math={0: (), 1: math, 2: math},
        speedups=True,
    )
    records.write_class_check(
        study,
        "; ".join(math),
        {
            "kind": "time to target",
            "verdict": "pass",
            "trial": 1,
            "samples_to_target": 96,
            "baseline_samples_to_target": 120,
            "speedup_to_target": 2.1,
        },
    )
    _confirmed(study, {1: [1.95, 1.90, 2.05], 2: [1.82, 1.81, 1.87]})
    assert to_target_factor(study, study.trials[1]) == to_target_factor(study, study.trials[2]) == pytest.approx(1.25)
    assert [t.number for t in export_order(study)][:2] == [1, 2]
    assert exported(study).number == 1


def test_a_trial_is_shown_by_what_it_changes_from_what_the_script_ran(tmp_path: Path) -> None:
    """Seen on a public script run with `-j 2` and its own batch 12: trial lines hid num_workers 0 and batch 8,
    autotune's defaults, and one trial at batch 8 was labelled "(baseline)". They differ from the script's own."""
    from autotune.apply.display import knob_summary

    ran = {"num_workers": {"requested": 0, "in_effect": 2}, "batch_size": {"requested": 8, "in_effect": 12}}
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 12.0)], applied={0: ran})
    knobs = baseline_knobs(study)
    assert knobs.ran["num_workers"] == 2 and knobs.ran["batch_size"] == 12 and knobs.config["num_workers"] == 0
    assert knob_summary(TINY.knobs(), knobs) == "(baseline)"  # the baseline's own config runs the script as written
    assert knob_summary(TINY.replace(num_workers=1).knobs(), knobs) == "num_workers=1 batch_size=8"
    assert (
        knob_summary(TINY.replace(set_to_none=False).knobs(), knobs) == "num_workers=0 batch_size=8 set_to_none=False"
    )


def test_the_baselines_draws_are_every_speedups_denominator_and_their_spread_is_said(tmp_path: Path) -> None:
    from autotune.apply.display import noise_note

    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 10.5)])
    assert results.baseline_sps(study) == 10.0 and results.baseline_spread(study) is None and noise_note(study) is None
    records.write_baseline_draw(study, 8.0)  # a second process of the same config ran 20% slower
    assert results.baseline_sps(study) == pytest.approx(9.0)
    assert results.baseline_spread(study) == pytest.approx((8 / 9, 10 / 9))
    note = noise_note(study) or ""
    assert "2 draws" in note and "x0.89..x1.11" in note and "cannot tell these configs apart" in note, note
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["baseline"]["samples_per_s"] == pytest.approx(9.0) and best["speedup"] == pytest.approx(10.5 / 9)
    assert best["baseline"]["search_draws"] == [10.0, 8.0] and best["baseline"]["noise"].startswith("x0.889..x1.111")


def test_a_no_change_export_is_x1_whatever_its_own_draw_measured(tmp_path: Path) -> None:
    """The baseline exported (nothing faster): its trial drew 10.0 beside a second draw of 8.0, so its figure
    over their median is x1.11; applying it trains at the user's own speed: x1, the draws' spread said apart."""
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 0.0)])
    records.write_baseline_draw(study, 8.0)
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 0 and best["speedup"] == 1.0
    assert best["baseline"]["noise"].startswith("x0.889..x1.111")


def test_a_config_of_the_baselines_training_is_never_passed_over_as_unchecked(tmp_path: Path) -> None:
    """Once a check passed (bf16, here), a checked config went before every unchecked one, and a faster config
    of the baseline's own training math was passed over as "not checked": it needs no check."""
    study = study_with(
        tmp_path,
        [("baseline", {}, 10.0), ("search", {"precision": "bf16"}, 20.0), ("search", {"num_workers": 2}, 25.0)],
        math={0: (), 1: ("precision fp32 -> bf16",), 2: ()},
    )
    study.set_user_attr(PARITY, {"1": {"verdict": "pass"}})
    assert exported(study).number == 2
    best = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert (
        best["training_math"]["verdict"] == "same"
        and "no parity check is needed" in best["training_math"]["same_means"]
    )
