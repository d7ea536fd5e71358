"""The search session: it owns its signal handlers (installed for the run, restored after), stores the
trial timeout for workers, names the objective, runs without a budget when --n-trials bounds it, and
says and stores why its trials stopped (one Stop per run)."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.errors import AutotuneError
from autotune.core.outcomes import Reason
from autotune.search.loop import session as session_module
from autotune.search.loop import draws, stops
from autotune.search.loop.session import SearchSession, Stop
from autotune.search.store import records, results
from autotune.search.store.records import StudyRecord, TrialRecord, write
from autotune.search.space.spec import DEFAULT_SPACE
from autotune.search.store.storage import open_storage
from autotune.trial.processes.placement import Placement

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, warmup_steps=1, timed_steps=3, window=1)


def settings(tmp_path: Path, **kw: Any) -> SearchSettings:
    base = dict(
        budget_s=120.0,
        storage=str(tmp_path / "studies.db"),
        space=str(DEFAULT_SPACE),
        studies_dir=str(tmp_path / "studies"),
        base=TINY,
        parity_steps=0,
    )
    return SearchSettings(**{**base, **kw})


def test_create_stores_timeout_and_names_the_objective(tmp_path: Path) -> None:
    session = SearchSession.create(settings(tmp_path, trial_timeout_s=77.0), warm=False, say=lambda s: None)
    assert session.study.metric_names == ["samples_per_s"]  # optuna-dashboard labels its plots with it
    record = StudyRecord.of(session.study)
    assert record.trial_timeout_s == 77.0 and record.space and record.workload["pipeline"] == TINY.pipeline
    roles = [t.user_attrs["role"] for t in session.study.get_trials(deepcopy=False)]
    assert roles == ["baseline", "warm_start"]  # enqueued, not run: create never runs a trial


def test_no_warm_server_when_trials_span_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trial of a multi-node session starts under the node launcher: a fork server would only idle."""
    for key, value in Placement(2, "torchx", "local_cwd").to_env().items():
        monkeypatch.setenv(key, value)
    said: list[str] = []
    session = SearchSession.create(settings(tmp_path), warm=True, say=said.append)
    with session._warm_server() as server:
        assert server is None
    assert not any("warm start" in line for line in said)


def test_create_needs_no_budget(tmp_path: Path) -> None:
    s = settings(tmp_path, budget_s=None)
    SearchSession.create(s, warm=False, say=lambda s: None)
    assert s.trial_timeout == 600.0  # a default, not a quarter of "forever"


def test_worker_without_budget_takes_the_studys_timeout(tmp_path: Path) -> None:
    SearchSession.create(settings(tmp_path, trial_timeout_s=90.0), warm=False, say=lambda s: None)
    joined = SearchSession.join(settings(tmp_path, budget_s=None, n_trials=3), None, warm=False)
    assert joined.settings.trial_timeout == 90.0  # was 365 days / 4 before the study stored it
    own = SearchSession.join(settings(tmp_path, budget_s=None, n_trials=3, trial_timeout_s=30.0), None, warm=False)
    assert own.settings.trial_timeout == 30.0  # --trial-timeout on the worker wins


def test_join_refuses_a_study_search_did_not_make(tmp_path: Path) -> None:
    optuna.create_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))
    with pytest.raises(AutotuneError, match="not created by `autotune search`"):
        SearchSession.join(settings(tmp_path, n_trials=1), None, warm=False)


@pytest.mark.slow
def test_run_installs_and_restores_signal_handlers(tmp_path: Path) -> None:
    seen: list[Any] = []
    session = SearchSession.create(settings(tmp_path, n_trials=1), warm=False, say=lambda s: None)

    from autotune.search.loop.runner import Events

    events = Events(
        started=lambda n, role, cfg: seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
    )
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        outcome = session.run(events)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is old_term
    finally:
        signal.signal(signal.SIGINT, before)
    during_int, during_term = seen[0]
    assert during_int is during_term and callable(during_int)  # Ctrl-C works even though it was ignored
    assert outcome.trials == 1 and not outcome.interrupted
    assert outcome.best_yaml is not None and outcome.best_yaml.is_file()


def test_create_only_defers_the_space_to_the_first_worker(tmp_path: Path) -> None:
    """A CPU-only database host must not decide the space for GPU workers (fp16, pinning, gpus)."""
    made = SearchSession.create(settings(tmp_path), warm=False, say=lambda s: None, defer=True)
    record = StudyRecord.of(made.study)
    assert not record.resolved and record.fingerprint == {} and made.study.trials == []
    assert "fp16" in record.space["knobs"]["precision"]["choices"]  # stored as written
    notes: list[str] = []
    first = SearchSession.join(settings(tmp_path, n_trials=1), None, warm=False, say=notes.append)
    record = StudyRecord.of(first.study)
    assert record.resolved and record.fingerprint["cpu_cores"]
    assert "fp16" not in str(record.space["knobs"]["precision"])
    assert any("fp16" in n for n in notes)  # the worker says what its hardware dropped
    roles = [t.user_attrs["role"] for t in first.study.get_trials(deepcopy=False)]
    assert roles == ["baseline", "warm_start"]
    SearchSession.join(settings(tmp_path, n_trials=1), None, warm=False)  # a second worker adds nothing
    assert len(first.study.get_trials(deepcopy=False)) == 2


@pytest.mark.slow
def test_search_stops_after_consecutive_data_failures(tmp_path: Path) -> None:
    """Bad data fails every config the same way: three in a row end the search, with the reason."""
    base = TrialConfig(
        pipeline="tests.trial.data_fault_pipelines:make_large",
        image_size=64,
        batch_size=2,
        warmup_steps=1,
        timed_steps=4,
        window=1,
    )
    session = SearchSession.create(settings(tmp_path, n_trials=6, base=base), warm=True, say=lambda s: None)
    outcome = session.run()
    assert outcome.trials == 3 and outcome.code == 2
    assert "3 trials in a row failed on the data" in outcome.error and "dataset item 3" in outcome.error
    reasons = [t.user_attrs.get("reason") for t in session.study.trials]
    assert reasons == ["data"] * 3 and outcome.best_yaml is None


def test_bad_unet_data_is_refused_before_any_trial(tmp_path: Path) -> None:
    from autotune.core.errors import DataError
    from autotune.pipelines.unet.data import make_data

    data = make_data(tmp_path / "data", n=12, size=(96, 64), seed=0)
    bad = sorted((data / "images").iterdir())[2]
    bad.write_bytes(b"not a jpeg")
    unet = TrialConfig(image_size=64, data_dir=str(data))
    with pytest.raises(DataError, match=bad.name):
        SearchSession.create(settings(tmp_path, base=unet), warm=False, say=lambda s: None)
    assert not (tmp_path / "studies.db").exists() or not optuna.get_all_study_summaries(
        open_storage(str(tmp_path / "studies.db"))
    )
    notes: list[str] = []
    SearchSession.create(settings(tmp_path, base=unet, skip_bad_data=True), warm=False, say=notes.append)
    assert any("dropped 1" in n for n in notes)


def test_a_global_batch_search_keeps_every_trials_optimizer_step(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  batch_size: [2, 4, 8, 16, 32]\n  precision: [fp32, bf16]\n")
    said: list[str] = []
    base = TINY.replace(global_batch=16, batch_size=16)
    s = settings(tmp_path, base=base, space=str(space), n_trials=6, confirm_rounds=0, sampler="random", seed=1)
    session = SearchSession.create(s, warm=True, say=said.append)  # six trials: forked, not six cold starts
    assert any(line.startswith("space: batch_size: dropped 32") for line in said), said
    session.run()
    ran = [t for t in session.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(ran) >= 4
    for t in ran:
        record = TrialRecord.from_frozen(t)
        accum = record.applied["grad_accum"]["in_effect"]
        assert record.config["batch_size"] * accum * record.config["gpus"] == 16, (record.config, accum)
    assert {TrialRecord.from_frozen(t).config["batch_size"] for t in ran} - {16}  # micro-batches were searched
    assert StudyRecord.of(session.study).workload["global_batch"] == 16  # workers and exports read it there


def fake_trials(monkeypatch: pytest.MonkeyPatch, tell: Any) -> list[int]:
    """Trials told by `tell(study, trial, cfg)` instead of launched: the loop alone, in milliseconds."""
    ran: list[int] = []

    def run_one(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, *args: Any) -> Any:
        ran.append(trial.number)
        write(trial, TrialRecord(role=TrialRecord.of(trial).role, config=cfg.knobs()))
        return tell(study, trial, cfg)

    monkeypatch.setattr(session_module, "run_one", run_one)
    # The baseline's second draw measures what trial 0 did: an A/A draw, no process.
    monkeypatch.setattr(draws, "measure", lambda *_: 10.0)
    return ran


def tally_of(session: SearchSession) -> Any:
    """A tally whose last trial is the study's last, as the loop leaves it."""
    tally = stops.Tally()
    tally.last = TrialRecord.from_frozen(session.study.trials[-1])
    return tally


def measured(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig) -> Any:
    return study.tell(trial, 10.0 + trial.number)


def test_the_trials_stop_at_n_trials_said_and_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = fake_trials(monkeypatch, measured)
    said: list[str] = []
    s = settings(tmp_path, budget_s=None, n_trials=3, confirm_rounds=0)
    session = SearchSession.create(s, warm=False, say=said.append)
    report = session.run()
    assert len(ran) == report.trials == 3 and report.stop == Stop.N_TRIALS and report.code == 0
    assert "autotune: the 3 trial(s) asked for (--n-trials) have run" in said
    assert StudyRecord.of(session.study).stop_reason == "n_trials"  # the last run's, on the study


def test_the_same_failure_before_any_measurement_stops_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig) -> Any:
        write(trial, TrialRecord(role=TrialRecord.of(trial).role, reason=Reason.CRASH, message="boom\nat line 3"))
        return study.tell(trial, state=optuna.trial.TrialState.FAIL)

    ran = fake_trials(monkeypatch, crash)
    session = SearchSession.create(settings(tmp_path, budget_s=None, n_trials=10), warm=False, say=lambda s: None)
    report = session.run()
    assert len(ran) == 3 and report.stop == Stop.SAME_FAILURES and report.code == 2
    assert (
        report.error is not None
        and "3 trials in a row failed the same way" in report.error
        and "(crash: boom)" in report.error
    )
    assert StudyRecord.of(session.study).stop_reason == "same_failures" and report.best_yaml is None
    assert "run it alone" not in report.error  # a pipeline has no command of its own
    # A script's is the user's own command: the job's kind gives it.
    script = dataclasses.replace(session.settings, base=TINY.replace(pipeline="script:/jobs/train.py --epochs 1"))
    session.settings = script
    said = stops.say_stop(Stop.SAME_FAILURES, tally_of(session), session.settings, lambda line: None)
    assert said is not None and "(run it alone to see: python /jobs/train.py --epochs 1)" in said


def test_a_listed_space_ends_exhausted_without_a_trial_it_would_write_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  batch_size: [2, 4]\n  num_workers: [0]\n")
    ran = fake_trials(monkeypatch, measured)
    said: list[str] = []
    s = settings(tmp_path, budget_s=None, space=str(space), confirm_rounds=0)
    session = SearchSession.create(s, warm=False, say=said.append)
    report = session.run()
    assert report.stop == Stop.SPACE_EXHAUSTED and StudyRecord.of(session.study).stop_reason == "space_exhausted"
    configs = [TrialRecord.from_frozen(t).config["batch_size"] for t in session.study.trials]
    assert {2, 4} <= set(configs) and len(ran) == len(session.study.trials)  # each run, nothing written off
    assert any(line.startswith("autotune: the space is exhausted: each of its 2 configs") for line in said), said


def test_an_interrupt_is_the_stop_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig) -> Any:
        raise KeyboardInterrupt

    fake_trials(monkeypatch, interrupted)
    session = SearchSession.create(settings(tmp_path, budget_s=None, n_trials=3), warm=False, say=lambda s: None)
    report = session.run()
    assert report.interrupted and report.stop == Stop.INTERRUPTED and report.code == 130
    assert StudyRecord.of(session.study).stop_reason == "interrupted"


def test_the_run_ends_with_the_alone_rounds_given_the_patcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After confirmation and the gate, the session hands the command's patcher (apply/export/patched.patched_copy)
    to the alone rounds, with the run's one budget, and reports their record: best.yaml is written after."""
    calls: list[Any] = []

    def alone_run(study: Any, s: Any, budget: Any, patch: Any, say: Any) -> dict[str, Any]:
        calls.append((budget, patch))
        return {"trial": 1, "skipped": "a test"}

    monkeypatch.setattr(session_module.alone, "run", alone_run)
    session = SearchSession.create(settings(tmp_path, n_trials=1, confirm_rounds=0), warm=False, say=lambda s: None)
    patch = object()
    outcome = session.run(patch=patch)  # type: ignore[arg-type]
    assert len(calls) == 1 and calls[0][1] is patch and calls[0][0] is not None
    assert outcome.alone == {"trial": 1, "skipped": "a test"} and outcome.best_yaml is not None


@pytest.mark.slow
@pytest.mark.side_by_side
def test_the_baseline_is_drawn_twice_and_every_speedup_is_over_the_draws_median(tmp_path: Path) -> None:
    """Seen on a public script: trial 0 drew a slow process (613 samples/s against 863 in confirmation) and
    every speedup on the leaderboard was inflated by it. Trial 0's config runs once more in a process of its
    own before any other trial; the speedups are over the median of both draws, their spread is said."""
    said: list[str] = []
    s = settings(tmp_path, budget_s=None, n_trials=2, confirm_rounds=0, sampler="random", seed=1)
    session = SearchSession.create(s, warm=True, say=said.append)
    session.run()
    study = session.study
    first, again = float(study.trials[0].value), records.baseline_draws(study)
    assert len(again) == 1 and again[0] > 0 and (tmp_path / "studies").exists()
    median = (first + again[0]) / 2
    assert results.baseline_sps(study) == pytest.approx(median)
    line = next(line for line in said if line.startswith("baseline: another draw"))
    assert (
        f"(the draws before: {first:.2f})" in line and f"over their median, {median:.2f}" in line and "spread x" in line
    )
    record = TrialRecord.from_frozen(study.trials[1])
    assert record.speedup == pytest.approx(float(study.trials[1].value) / median)
    best = yaml.safe_load(Path(str(session.export_best())).read_text())
    assert best["baseline"]["search_draws"] == [round(first, 4), round(again[0], 4)] and "noise" in best["baseline"]
