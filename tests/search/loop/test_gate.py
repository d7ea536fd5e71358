"""search/loop/gate.py: a winner whose numerics break without NaN fails parity and is not exported; the next
best is checked instead, and the baseline's reference trajectory is measured once per study."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.errors import AutotuneError
from autotune.core.settings import SearchSettings
from autotune.core.configfile import to_yaml
from autotune.search.store import records
from autotune.search.loop import gate
from autotune.search.store.records import PARITY, of_result, write
from autotune.search.store.results import best_export, choose, class_label, exported
from autotune.search.store.records import FEASIBLE_KEY
from autotune.search.store.storage import open_storage
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer

# conftest's `server` fixture: the checks' runs fork from one warm server instead of starting cold.
WARM_PRELOAD = (*DEFAULT_PRELOAD, "tests.parity_pipelines")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("repo_on_path")]
BROKEN = TrialConfig(pipeline="tests.parity_pipelines:offset", image_size=32, seed=0)


def record(study: optuna.Study, role: str, cfg: TrialConfig, sps: float) -> None:
    trial = study.ask()
    trial.set_user_attr("role", role)
    trial.set_constraint(FEASIBLE_KEY, 0.0)
    write(trial, of_result(role, cfg, TrialResult(status="ok", samples_per_s=sps), sps / 10.0, False))
    study.tell(trial, sps)


def test_a_winner_that_trains_differently_is_skipped_for_the_next_best(tmp_path: Path, server: WarmServer) -> None:
    study = optuna.create_study(
        study_name="g", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize"
    )
    record(study, "baseline", BROKEN, 10.0)
    record(study, "search", BROKEN.replace(precision="bf16"), 30.0)  # fastest, but bf16 rounds the net away
    record(study, "search", BROKEN.replace(num_threads=1), 20.0)  # the same training, one thread
    settings = SearchSettings(
        budget_s=600,
        storage=str(tmp_path / "studies.db"),
        studies_dir=str(tmp_path / "s"),
        study="g",
        base=BROKEN,
        parity_steps=20,
    )
    said: list[str] = []
    checks = gate.run(study, settings, server=server, say=said.append)
    assert checks is not None and checks["1"]["verdict"] == "fail" and "2" not in checks
    assert any("trial 1 FAILS" in line and "the next best is checked" in line for line in said), said
    # The next best computes the baseline's training: its step is the baseline's by construction, no check.
    assert "parity: trial 2 computes the baseline's training (same): no check is needed" in said
    assert exported(study).number == 2  # never the broken one
    best: dict[str, Any] = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["study"]["trial"] == 2 and "parity" not in best
    assert best["training_math"]["verdict"] == "same" and "same_means" in best["training_math"]
    assert study.user_attrs[PARITY]["1"]["deviation"] > study.user_attrs[PARITY]["1"]["tolerance"]
    # A resumed study keeps its checks and its reference: nothing is trained again.
    again: list[str] = []
    assert gate.run(study, settings, server=server, say=again.append) == checks
    assert not any("passes" in line or "FAILS" in line for line in again)
    assert study.user_attrs[PARITY]["1"]["verdict"] == "fail"
    assert records.parity_reference(study) is not None


def test_parity_off_checks_nothing(tmp_path: Path) -> None:
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "baseline", BROKEN, 10.0)
    record(study, "search", BROKEN.replace(precision="bf16"), 30.0)
    assert gate.run(study, SearchSettings(base=BROKEN, parity_steps=0), say=lambda s: None) is None
    assert PARITY not in study.user_attrs
    # Its training math differs and was never checked: the baseline is exported, the faster one named.
    choice = choose(study)
    assert choice.trial is not None and choice.trial.number == 0
    assert choice.passed_over[0]["trial"] == 1 and "it was not checked" in choice.passed_over[0]["why"]


def test_with_no_baseline_and_no_check_the_error_says_why_nothing_is_exported(tmp_path: Path) -> None:
    """A worker whose one trial is an unchecked bf16 config, the baseline not run: nothing may be exported,
    and the one line says which trial was passed over and why, not "no finished feasible trial"."""
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "warm_start", BROKEN.replace(precision="bf16"), 30.0)
    with pytest.raises(AutotuneError) as e:
        best_export(study, None, None)
    assert "trial 0: its training math differs (precision fp32 -> bf16)" in str(e.value)
    assert "the baseline has not finished a trial" in str(e.value)


def test_a_class_is_checked_once_and_a_changed_step_by_time_to_target(tmp_path: Path, server: WarmServer) -> None:
    """8 -> 32 changes the optimizer step: judged by the time to the baseline's loss, not by parity at equal
    samples. Its verdict stands for every config of its class (trial 2 is not trained again)."""
    healthy = TrialConfig(pipeline="tests.parity_pipelines:healthy", image_size=32, seed=0)
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "baseline", healthy, 10.0)
    record(study, "search", healthy.replace(batch_size=32), 30.0)  # 4x the optimizer step's samples
    record(study, "search", healthy.replace(batch_size=32, num_threads=1), 25.0)  # the same class again
    record(study, "search", healthy.replace(num_threads=1), 20.0)
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=healthy, parity_steps=10)
    said: list[str] = []
    checks = gate.run(study, settings, server=server, say=said.append)
    assert checks is not None and checks["1"]["kind"] == "time to target"
    label = "global batch 8 -> 32; lr 0.001 -> 0.002 (sqrt rule)"
    assert records.class_checks(study)[label]["trial"] == 1
    if checks["1"]["verdict"] == "fail":
        assert checks["2"]["verdict"] == "fail" and "was checked at trial 1" in checks["2"]["reason"]
        assert checks["3"]["kind"] == "parity" and exported(study).number == 3
    else:
        assert checks["1"]["speedup_to_target"] > 1 and exported(study).number == 1
        assert "2" not in checks
    assert sum("time to target: trial" in line for line in said) == 1, said  # one check for the class


def test_a_class_checked_at_the_trial_itself_keeps_its_own_reason(tmp_path: Path) -> None:
    """The check of trial 1's class was trial 1's own: its reason is said as it is, not as "checked at
    trial 1" of trial 1 (a circle); another trial of the class points to trial 1."""
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "baseline", BROKEN, 10.0)
    record(study, "search", BROKEN.replace(precision="bf16"), 30.0)
    record(study, "search", BROKEN.replace(precision="bf16", num_threads=1), 25.0)
    trials = study.get_trials()
    own = {"kind": "parity", "verdict": "not checkable", "trial": 1, "reason": "the script never seeds torch"}
    records.write_class_check(study, class_label(trials[1]), own)
    assert gate._standing(study, trials[1], {}) == own
    other = gate._standing(study, trials[2], {})
    assert other is not None and other["reason"].startswith(
        "its training math (precision fp32 -> bf16) was checked at trial 1"
    )


def test_a_config_of_the_baselines_training_is_not_checked(tmp_path: Path) -> None:
    """Its optimizer step is the baseline's by construction: the gate stops at it, nothing is run."""
    from tests.search.store.test_results import TINY, study_with

    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 2}, 12.0)], math={0: (), 1: ()})
    said: list[str] = []
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=TINY, parity_steps=5)
    assert gate.run(study, settings, say=said.append) == {}
    assert "parity: trial 1 computes the baseline's training (same): no check is needed" in said
    assert not (tmp_path / "s").exists()  # no run, no folder
