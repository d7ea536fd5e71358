"""search/loop/draws.py: the baseline drawn again in a process of its own: after trial 0, and at the middle
of a long trial loop, since a machine's speed drifts over a long search."""

from __future__ import annotations

from pathlib import Path

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.loop import draws
from autotune.search.store import records
from tests.search.store.test_results import study_with

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, seconds=15.0)


def test_a_long_trial_loop_draws_the_baseline_again_at_its_middle(tmp_path: Path) -> None:
    study = study_with(tmp_path, [("baseline", {}, 10.0)])
    long = Budget.of(SearchSettings(budget_s=7200.0, base=TINY), started=0.0).trials_begin(0.0)
    middle = long.search_deadline / 2
    assert not draws.due(study, long, now=middle + 1)  # trial 0's own further draw comes first
    records.write_baseline_draw(study, 9.0)
    assert not draws.due(study, long, now=middle - 1) and draws.due(study, long, now=middle + 1)
    records.write_baseline_draw(study, 11.0)
    assert not draws.due(study, long, now=middle + 1)  # drawn at the middle already
    short = Budget.of(SearchSettings(budget_s=600.0, base=TINY), started=0.0).trials_begin(0.0)
    (tmp_path / "short").mkdir()
    study2 = study_with(tmp_path / "short", [("baseline", {}, 10.0)])
    records.write_baseline_draw(study2, 9.0)
    assert not draws.due(study2, short, now=short.search_deadline - 1)  # a trial loop of 5 minutes: no more
    assert draws.statement(study, 11.0).startswith("baseline: another draw in its own process ran 11.00")
