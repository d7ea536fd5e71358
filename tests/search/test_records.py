"""The typed records of a study's user attrs: they round-trip through a real Optuna storage, and a
write never erases what another writer stored."""
from __future__ import annotations

from pathlib import Path

import optuna

from autotune.core.config import TrialConfig, TrialResult
from autotune.search.records import StudyRecord, TrialRecord, of_result, write
from autotune.search.storage import open_storage

RESULT = TrialResult(status="ok", samples_per_s=12.5, step_time_p50=0.2, data_wait_fraction=0.1,
                     peak_memory_bytes=2**20, windows=(11.0, 12.0), applied={"precision": {"in_effect": "bf16"}})


def study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="s", storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")


def test_trial_record_round_trips_through_the_storage(tmp_path: Path) -> None:
    s = study(tmp_path)
    trial = s.ask()
    write(trial, TrialRecord(role="baseline", config={"batch_size": 8}, owner={"pid": 1, "host": "h"}))
    write(trial, of_result("baseline", TrialConfig(), RESULT, speedup=1.0, contended=True))
    s.tell(trial, RESULT.samples_per_s)
    back = TrialRecord.from_frozen(s.trials[0])
    assert back.role == "baseline" and back.config == TrialConfig().knobs() and back.speedup == 1.0 and back.contended
    assert back.training_math == ()  # the baseline trains as the baseline: "same"
    assert back.owner == {"pid": 1, "host": "h"}  # the second write did not erase the first's owner
    assert back.windows == (11.0, 12.0) and back.metrics["peak_memory_bytes"] == 2**20
    assert back.result().samples_per_s == 12.5 and back.result().applied["precision"]["in_effect"] == "bf16"


def test_missing_attrs_have_one_default() -> None:
    r = TrialRecord.from_attrs({})
    assert (r.role, r.config, r.reason, r.speedup, r.contended, r.windows) == ("search", {}, None, None, False, ())
    assert TrialRecord.from_attrs({"unknown_key": 1, "role": "warm_start"}).role == "warm_start"


def test_study_record_round_trips(tmp_path: Path) -> None:
    s = study(tmp_path)
    StudyRecord(fingerprint={"cpu_cores": 2}, space={"batch_size": [4, 8]}, workload={"image_size": 64},
                sampler="gp", trial_timeout_s=90.0).write(s)
    back = StudyRecord.of(optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "studies.db"))))
    assert back.fingerprint == {"cpu_cores": 2} and back.space == {"batch_size": [4, 8]}
    assert back.sampler == "gp" and back.trial_timeout_s == 90.0 and back.ablation is None


def test_a_reference_to_trial_zero_is_kept() -> None:
    """repeat_of / retry_of = 0 name the baseline, trial 0: they must not vanish as if unset."""
    attrs = TrialRecord(role="baseline", retry_of=0, repeat_of=0).to_attrs()
    assert attrs["retry_of"] == 0 and attrs["repeat_of"] == 0
    assert TrialRecord.from_attrs(attrs).retry_of == 0
