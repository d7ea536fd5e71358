"""A study names the code its workers import, and anyone who can write the study can rename it: a worker
runs only a pipeline its own --pipeline names (the built-in unet without one), and refuses any other
study with exit 2 and one line, before it imports anything the study names or writes anything."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.search.store.storage import open_storage

CREATED_FOR = "tests.fault_pipelines:tiny"
REWRITTEN_TO = "tests.cli.untrusted_pipeline:make"


@pytest.fixture
def rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_on_path: Path) -> Path:
    """A study created for CREATED_FOR (`autotune search --create-only`, as users make one), whose
    pipeline another writer of the storage then changed to REWRITTEN_TO."""
    monkeypatch.chdir(tmp_path)
    journal = tmp_path / "shared.db"
    argv = ["--storage", str(journal), "--study", "s", "--pipeline", CREATED_FOR, "--studies-dir", "creator"]
    assert main(["search", "--create-only", *argv]) == 0
    study = optuna.load_study(study_name="s", storage=open_storage(str(journal)))
    study.set_user_attr("workload", {**study.user_attrs["workload"], "pipeline": REWRITTEN_TO})
    return journal


@pytest.mark.parametrize(
    "allowed",
    [
        ["--pipeline", CREATED_FOR],  # the worker was started for the study as it was created
        [],  # no --pipeline: the built-in unet only
    ],
)
def test_a_worker_refuses_a_study_whose_pipeline_it_was_not_started_for(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    rewritten: Path,
    allowed: list[str],
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv("AUTOTUNE_TEST_IMPORTED", str(marker))
    capsys.readouterr()
    before = rewritten.read_bytes()
    code = main(["worker", "--storage", str(rewritten), "--study", "s", "--n-trials", "1", *allowed])
    err = capsys.readouterr().err
    assert not marker.exists() and "tests.cli.untrusted_pipeline" not in sys.modules  # nothing of it imported
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert REWRITTEN_TO in lines[0] and "not one this worker may run" in lines[0], lines[0]
    assert rewritten.read_bytes() == before and not (tmp_path / "studies").exists()  # nothing written
