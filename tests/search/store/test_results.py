"""search/store/results.py: which trials count, their export order, and the best as an Export."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.configfile import to_yaml
from autotune.search.store.records import CONFIRMATION, PARITY, TrialRecord, write
from autotune.search.store.results import best_export, export_order, exported, gain_statement
from autotune.search.store.storage import open_storage

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1)


def study_with(
    tmp_path: Path, rows: list[tuple[str, dict, float]], math: dict[int, tuple[str, ...]] | None = None
) -> optuna.Study:
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
            ),
        )
        t.set_constraint("infeasible", 0.0)
        study.tell(t, value)
    return study


def test_without_confirmation_best_yaml_has_no_confirmed_section(tmp_path: Path) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"batch_size": 4}, 30.0)])
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
    assert exported(study).number == 1  # parity off: nothing is checked, the fastest is exported
    study.set_user_attr(PARITY, {"1": {"verdict": "not checked"}, "2": {"verdict": "not checked"}})
    assert exported(study).number == 2
    study.set_user_attr(PARITY, {"1": {"verdict": "pass"}})
    assert exported(study).number == 1


@pytest.mark.parametrize(
    "rounds, low, high, says",
    [
        (3, 0.92, 1.07, "no measurable gain over the baseline on this machine (the rounds read x0.92..x1.07)"),
        (3, 1.02, 1.30, "faster than the baseline in every round (x1.02..x1.30)"),
        (2, 0.80, 0.95, "slower than the baseline in every round (x0.80..x0.95)"),
        (1, 1.59, 1.59, "one round: a single draw (x1.59), not yet a measured gain"),
    ],
)
def test_the_confirmed_speedup_says_whether_its_rounds_tell_it_from_the_baseline(
    rounds: int, low: float, high: float, says: str
) -> None:
    assert gain_statement({"rounds": rounds, "speedup_range": [low, high]}) == says
