"""The cost estimate beside the wall time taken, as `show`, the report and the live line print it: its
error per trial, "not run" for a config written off on its estimate, a reused figure shown once."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from autotune.apply.display import LiveSearch, cost_rows
from autotune.apply.report import cost_html
from autotune.cli import main
from autotune.core.outcomes import Reason, Role
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord, write
from autotune.search.store.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    """The baseline (no estimate), one trial 20% over its estimate, one written off on its estimate, one
    reused from the second."""
    study = optuna.create_study(
        study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize"
    )
    rows = [
        TrialRecord(role=Role.BASELINE, config={"batch_size": 8}, wall_s=20.0, metrics={"samples_per_s": 9.0}),
        TrialRecord(config={"batch_size": 16}, cost_estimate_s=24.0, wall_s=30.0, metrics={"samples_per_s": 9.5}),
        TrialRecord(config={"batch_size": 64}, cost_estimate_s=59.1, reason=Reason.COST_ESTIMATE, message="not run"),
        TrialRecord(config={"batch_size": 16}, cost_estimate_s=24.0, wall_s=30.0, repeat_of=1),
    ]
    for record in rows:
        t = study.ask()
        write(t, record)
        if record.reason == Reason.COST_ESTIMATE:  # written off before launch, as admission does it
            t.set_constraint(FEASIBLE_KEY, 1.0)
        study.tell(t, float(record.metrics.get("samples_per_s", 0.0)))
    return study


def test_rows_put_the_estimate_beside_the_time_taken_with_its_error(study: optuna.Study) -> None:
    assert cost_rows(study) == [
        ("1", "search", "16", "24.0", "30.0", "-20%"),
        ("2", "search", "64", "59.1", "not run", "-"),
    ]
    assert cost_rows(study, top=1)[0][0] == "2"
    html = cost_html(study)
    assert "Time estimate vs wall time taken" in html and "-20%" in html and "not run" in html


def test_show_prints_the_estimate_error(
    study: optuna.Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "--storage", str(tmp_path / "studies.db")]) == 0
    out = capsys.readouterr().out
    assert "time: estimate before launch vs wall time taken" in out and "-20%" in out and "not run" in out


def test_the_live_line_gives_the_estimate_and_the_time_taken(study: optuna.Study) -> None:
    console = Console(file=io.StringIO(), width=200, record=True)
    LiveSearch(study, None, console).finished(study.trials[1])
    assert "[time: estimated 24 s, took 30 s]" in console.export_text()
