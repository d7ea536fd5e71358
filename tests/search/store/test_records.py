"""The typed records of a study's user attrs: they round-trip through a real Optuna storage, and a
write never erases what another writer stored."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.errors import AutotuneError
from autotune.search.store import records
from autotune.search.store.records import StudyRecord, TrialRecord, of_result, write
from autotune.search.store.storage import open_storage

RESULT = TrialResult(
    status="ok",
    samples_per_s=12.5,
    step_time_p50=0.2,
    data_wait_fraction=0.1,
    peak_memory_bytes=2**20,
    windows=(11.0, 12.0),
    applied={"precision": {"in_effect": "bf16"}},
)


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
    StudyRecord(
        fingerprint={"cpu_cores": 2},
        space={"batch_size": [4, 8]},
        workload={"image_size": 64},
        sampler="gp",
        trial_timeout_s=90.0,
    ).write(s)
    back = StudyRecord.of(optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "studies.db"))))
    assert back.fingerprint == {"cpu_cores": 2} and back.space == {"batch_size": [4, 8]}
    assert back.sampler == "gp" and back.trial_timeout_s == 90.0 and back.ablation is None


def test_a_reference_to_trial_zero_is_kept() -> None:
    """repeat_of / retry_of = 0 name the baseline, trial 0: they must not vanish as if unset."""
    attrs = TrialRecord(role="baseline", retry_of=0, repeat_of=0).to_attrs()
    assert attrs["retry_of"] == 0 and attrs["repeat_of"] == 0
    assert TrialRecord.from_attrs(attrs).retry_of == 0


def test_the_study_attrs_of_a_search_s_end_round_trip(tmp_path: Path) -> None:
    s = study(tmp_path)
    assert records.confirmation(s) is None and records.gate_checks(s) == {} and records.class_checks(s) == {}
    assert records.parity_reference(s) is None and records.gate_check(s, 1) is None
    records.write_confirmation(s, {"rounds": 2, "rows": [], "winner": None})
    records.write_gate_checks(s, {"1": {"verdict": "pass"}})
    records.write_class_check(s, "precision fp32 -> bf16", {"verdict": "fail", "trial": 3})
    records.write_class_check(s, "global batch 8 -> 16", {"verdict": "pass", "trial": 4})  # adds, keeps the first
    records.write_parity_reference(s, {"steps": 10})
    records.write_ablation(s, [{"knob": "precision"}])
    back = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "studies.db")))
    assert records.confirmation(back) == {"rounds": 2, "rows": [], "winner": None}
    assert records.gate_check(back, 1) == {"verdict": "pass"}
    assert set(records.class_checks(back)) == {"precision fp32 -> bf16", "global batch 8 -> 16"}
    assert records.parity_reference(back) == {"steps": 10}
    assert StudyRecord.of(back).ablation == [{"knob": "precision"}]
    (summary,) = optuna.get_all_study_summaries(open_storage(str(tmp_path / "studies.db")))
    assert StudyRecord.of(summary).sampler == "tpe"  # a summary reads as the study does


def test_workers_and_claims_round_trip(tmp_path: Path) -> None:
    s = study(tmp_path)
    key = records.worker_key("h", 7, "abc")
    records.write_worker(s, key, {"host": "h", "pid": 7, "started": 1.0, "state": "running"})
    records.write_claim(s, records.FINISHER, key)
    assert records.workers(s) == {key: {"host": "h", "pid": 7, "started": 1.0, "state": "running"}}
    assert records.worker(s, key)["state"] == "running" and records.worker(s, "worker:none") == {}
    assert records.claimant(s, records.FINISHER) == key and records.claimant(s, records.RESOLVER) is None


def test_a_queued_trial_carries_its_record(tmp_path: Path) -> None:
    s = study(tmp_path)
    records.enqueue(s, {"batch_size": 4}, TrialRecord(role="warm_start", config={"batch_size": 4}))
    trial = s.ask()
    assert TrialRecord.of(trial).role == "warm_start"  # a running trial reads as a finished one
    records.write_owner(trial, {"pid": 1})
    records.write_reason(trial, "interrupted")
    s.tell(trial, state=optuna.trial.TrialState.FAIL)
    back = TrialRecord.of(s.trials[0])
    assert back.owner == {"pid": 1} and back.reason == "interrupted" and not records.contended(s.trials[0])
    assert back.config_for(TrialConfig()).batch_size == 4


def test_the_memory_estimate_and_the_model_facts_round_trip(tmp_path: Path) -> None:
    s = study(tmp_path)
    trial = s.ask()
    estimate: records.MemoryEstimateRecord = {
        "params": 4,
        "grads": 4,
        "optimizer": 8,
        "activations": 16,
        "runtime": 0,
        "total": 32,
        "strategy": "one process",
    }
    write(trial, TrialRecord(role="search", memory_estimate=estimate))
    write(trial, of_result("search", TrialConfig(), RESULT, speedup=None, contended=False))  # keeps the estimate
    s.tell(trial, 1.0)
    assert TrialRecord.from_frozen(s.trials[0]).memory_estimate == estimate
    assert TrialRecord.from_attrs({}).memory_estimate is None
    StudyRecord(sampler="auto").write(s)
    records.write_model_facts(s, {"param_count": 1})
    assert StudyRecord.of(s).model_facts == {"param_count": 1} and StudyRecord.of(s).sampler == "auto"


_WRITER = """
import sys, time
import os
import subprocess
import sys
import time
from pathlib import Path
import optuna
import pytest
from autotune.search.store import records
from autotune.search.store.storage import open_storage
folder, me = Path(sys.argv[1]), sys.argv[2]
s = optuna.load_study(study_name="s", storage=open_storage(str(folder / "studies.db")))
(folder / f"ready-{me}").touch()
while not (folder / "go").exists():  # both writers start together, so their writes interleave
    time.sleep(0.005)
for i in range(15):
    records.write_class_check(s, f"class {me}-{i}", {"verdict": "pass", "trial": i})
"""


def test_class_checks_written_at_once_by_two_processes_are_all_kept(tmp_path: Path) -> None:
    """Two fleet workers finishing class checks at once: each check is its own key, none is dropped
    (a read-modify-write of one shared dict loses the other writer's checks)."""
    study(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), me], env=env, stderr=subprocess.PIPE)
        for me in ("a", "b")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{me}").exists() for me in ("a", "b")) and time.monotonic() < deadline:
        time.sleep(0.02)
    (tmp_path / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    back = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "studies.db")))
    want = {f"class {me}-{i}" for me in ("a", "b") for i in range(15)}
    assert set(records.class_checks(back)) == want
    assert records.class_checks(back)["class b-7"] == {"verdict": "pass", "trial": 7}


def test_a_study_s_older_class_check_dict_is_still_read(tmp_path: Path) -> None:
    s = study(tmp_path)
    s.set_user_attr(records.CLASSES, {"precision fp32 -> bf16": {"verdict": "fail", "trial": 2}})
    records.write_class_check(s, "global batch 8 -> 16", {"verdict": "pass", "trial": 4})
    assert records.class_checks(s) == {
        "precision fp32 -> bf16": {"verdict": "fail", "trial": 2},
        "global batch 8 -> 16": {"verdict": "pass", "trial": 4},
    }


def test_a_trial_record_that_names_more_than_knobs_is_refused_not_applied() -> None:
    """Whoever can write a study could queue a trial whose stored config names a pipeline to import: only
    knobs are applied from a record; anything else is refused."""
    base = TrialConfig(pipeline="unet")
    assert TrialRecord(config={"num_workers": 2}).config_for(base).num_workers == 2
    with pytest.raises(AutotuneError, match="'pipeline'.*not knobs"):
        TrialRecord(config={"num_workers": 2, "pipeline": "evil_mod:make"}).config_for(base)


def test_each_trial_has_one_outcome(tmp_path: Path) -> None:
    """records.outcome reads state, constraint, reason and reuse once: each kind of trial a search leaves
    gets its own word, and only the measured ones rank (the leaderboard reads the same function)."""
    from optuna.trial import TrialState

    from autotune.core.outcomes import Outcome, Reason
    from autotune.search.store.results import leaderboard

    study = optuna.create_study(storage=open_storage(str(tmp_path / "s.db")), direction="maximize")

    def trial(
        record: TrialRecord, value: float | None, *, infeasible: bool = False, state: TrialState = TrialState.COMPLETE
    ) -> None:
        t = study.ask()
        write(t, record)
        if infeasible:
            t.set_constraint(records.FEASIBLE_KEY, 1.0)
        if state == TrialState.COMPLETE:
            study.tell(t, value)
        else:
            study.tell(t, state=state)

    trial(TrialRecord(), 9.0)
    trial(TrialRecord(contended=True), 12.0)
    trial(TrialRecord(repeat_of=0), 9.0)
    trial(TrialRecord(reason=Reason.OOM, message="out of memory"), 0.0, infeasible=True)
    trial(TrialRecord(reason=Reason.MEMORY_ESTIMATE), 0.0, infeasible=True)
    trial(TrialRecord(reason=Reason.COST_ESTIMATE), None, state=TrialState.FAIL)  # deferred to a longer run
    trial(TrialRecord(reason=Reason.TIMEOUT), None, state=TrialState.FAIL)
    trial(TrialRecord(reason=Reason.PRUNED), None, state=TrialState.PRUNED)
    study.ask()  # running
    got = [records.outcome(t) for t in study.get_trials(deepcopy=False)]
    assert got == [
        Outcome.MEASURED,
        Outcome.CONTENDED,
        Outcome.REUSED,
        Outcome.INFEASIBLE,
        Outcome.WRITTEN_OFF,
        Outcome.WRITTEN_OFF,
        Outcome.FAILED,
        Outcome.PRUNED,
        Outcome.PENDING,
    ]
    assert [t.number for t in leaderboard(study)] == [0, 1]  # contended below clean, the reuse not again


def test_a_script_s_class_is_the_global_batch_its_ranks_ran_not_the_one_planned() -> None:
    """Under torchrun a script that divides its own accumulation by the world size keeps its global batch:
    its trial planned 2 x 8 but its ranks delivered 8 per step, so it trains like the baseline; one that
    keeps its per-rank batch ran 16, and its record says so, with the lr its rule gave that batch."""

    def math(requested: int, in_effect: int) -> tuple[str, ...]:
        cfg = TrialConfig(gpus=2, lr_scaling="linear")
        applied = {"global_batch": {"requested": requested, "in_effect": in_effect, "why": ""}}
        return of_result(
            "search", cfg, TrialResult(status="ok", samples_per_s=1.0, applied=applied), 1.0, False
        ).training_math  # type: ignore[return-value]

    assert math(16, 8) == ()
    assert math(16, 16) == ("global batch 8 -> 16", "lr 0.001 -> 0.002 (linear rule)")
    # A trial that observed no planned batch keeps the config's arithmetic.
    cfg = TrialConfig(gpus=2, lr_scaling="linear")
    assert of_result("search", cfg, TrialResult(status="ok", samples_per_s=1.0), 1.0, False).training_math[0] == (
        "global batch 8 -> 16"
    )
