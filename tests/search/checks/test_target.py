"""search/checks/target.py and search/checks/classes.py: a changed optimizer step is judged by the time it takes to reach
the baseline's loss; each training-math class is checked once, and a failed class is never run again."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.pipelines import preload_modules
from autotune.core.settings import SearchSettings
from autotune.core.configfile import to_yaml
from autotune.search.store import records
from autotune.search.checks import target
from autotune.search.loop import gate
from autotune.search.checks.parity import Reference
from autotune.search.store.records import TrialRecord, of_result, write
from autotune.search.store.results import best_export, checks_summary, exported
from autotune.search.store.records import FEASIBLE_KEY
from autotune.search.loop.session import SearchSession
from autotune.search.store.storage import open_storage
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer

# conftest's `server` fixture: the gate's runs here fork from one warm server instead of starting cold.
WARM_PRELOAD = (*DEFAULT_PRELOAD, *preload_modules("unet"), "tests.parity_pipelines")
HEALTHY = TrialConfig(pipeline="tests.parity_pipelines:healthy", image_size=32, seed=0)


def reference(losses: list[float], twin: list[float] | None = None) -> Reference:
    return Reference(
        TrialConfig(batch_size=8).replace(warmup_steps=0, timed_steps=len(losses)),
        len(losses),
        tuple(losses),
        tuple(twin or losses),
        1.0,
    )


# --- the verdict, on given trajectories -----------------------------------------------------------------


def test_reaching_the_loss_sooner_in_wall_time_passes() -> None:
    ref = reference([1.0 - 0.02 * i for i in range(10)])  # the baseline: 80 samples to reach its own end
    # batch 32: each step 4x the samples, the loss falls 0.06 a step: there after 3 steps, 96 samples
    v = target.judge([1.0 - 0.06 * i for i in range(8)], 32, ref, candidate_sps=30.0, baseline_sps=10.0)
    assert v.passed and v.samples == 128 and v.baseline_samples == 80, v
    assert v.speedup == pytest.approx((80 / 10) / (128 / 30))


def test_not_reaching_it_within_the_cap_fails() -> None:
    ref = reference([1.0 - 0.02 * i for i in range(10)])
    v = target.judge([1.0 - 0.001 * i for i in range(4)], 64, ref, candidate_sps=80.0, baseline_sps=10.0)
    assert not v.passed and v.samples is None and "did not reach" in v.reason


def test_slower_in_wall_time_or_diverging_after_fails() -> None:
    ref = reference([1.0 - 0.02 * i for i in range(10)])
    slow = target.judge([1.0 - 0.06 * i for i in range(8)], 32, ref, candidate_sps=10.0, baseline_sps=10.0)
    assert not slow.passed and "not sooner" in slow.reason
    rising = [1.0, 0.8, 0.6, 0.6, 1.5, 2.0, 3.0, 4.0]  # reaches the target, then blows up
    diverged = target.judge(rising, 32, ref, candidate_sps=30.0, baseline_sps=10.0)
    assert not diverged.passed and "beyond the tolerance" in diverged.reason


def test_a_target_reached_within_a_few_baseline_steps_is_not_checkable(tmp_path: Path) -> None:
    """Seen on a public script: a batch change passed with "1.91x sooner" on a target the baseline reached
    after one step. Such a target is no check: "not checked", decided before the candidate trains."""
    early = reference([1.0, 1.01, 0.99, 1.02, 1.0, 1.01, 0.98, 1.02, 1.0, 1.01])  # no fall past its first step
    why = target.thin(early)
    assert why is not None and "reached within 1 of its steps" in why and f"at least {target.MIN_STEPS}" in why
    v = target.check(TrialConfig(batch_size=16), early, tmp_path, 60.0, candidate_sps=30.0, baseline_sps=10.0)
    assert not v.passed and not v.checkable and v.to_dict()["verdict"] == "not checked", v
    assert not (tmp_path / "candidate").exists()  # nothing trained
    flat = reference([1.0 - 0.0005 * i for i in range(20)])  # reached late, but a 0.7% fall within 1% noise
    assert "within its noise" in (target.thin(flat) or "")
    assert target.thin(reference([1.0 - 0.02 * i for i in range(10)])) is None  # 10 steps, 15% fall: it tells


# --- real runs ------------------------------------------------------------------------------------------


def record(study: optuna.Study, role: str, cfg: TrialConfig, sps: float, base_sps: float = 10.0) -> None:
    trial = study.ask()
    trial.set_user_attr("role", role)
    trial.set_constraint(FEASIBLE_KEY, 0.0)
    write(trial, of_result(role, cfg, TrialResult(status="ok", samples_per_s=sps), sps / base_sps, False))
    study.tell(trial, sps)


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_a_larger_batch_that_gets_there_sooner_is_exported_with_its_math_named(
    tmp_path: Path, server: WarmServer
) -> None:
    """8 -> 32 with the sqrt lr at 3x the samples/s: parity at equal samples would fail it; it reaches the
    baseline's loss 1.5x sooner in wall time, so it passes and is exported, its change said."""
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "baseline", HEALTHY, 10.0)
    record(study, "search", HEALTHY.replace(batch_size=32), 30.0)
    record(study, "search", HEALTHY.replace(num_threads=1), 12.0)
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=HEALTHY, parity_steps=10)
    checks = gate.run(study, settings, server=server, say=lambda s: None)
    assert checks is not None and checks["1"]["verdict"] == "pass" and checks["1"]["speedup_to_target"] > 1
    assert exported(study).number == 1
    best: dict[str, Any] = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert best["parity"]["kind"] == "time to target" and best["parity"]["speedup_to_target"] > 1
    assert "global batch 8 -> 32" in best["training_math"]["changes"]
    assert best["training_math"]["lr"] == pytest.approx(2e-3)


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_the_unet_at_global_batch_64_on_a_small_set_still_fails(
    tmp_path: Path, tiny_data: Path, server: WarmServer
) -> None:
    unet = TrialConfig(pipeline="unet", data_dir=str(tiny_data), image_size=64, seed=0)
    study = optuna.create_study(storage=open_storage(str(tmp_path / "studies.db")), direction="maximize")
    record(study, "baseline", unet, 10.0)
    record(study, "search", unet.replace(batch_size=64), 25.0)
    settings = SearchSettings(budget_s=600, studies_dir=str(tmp_path / "s"), base=unet, parity_steps=10)
    checks = gate.run(study, settings, server=server, say=lambda s: None)
    assert checks is not None and checks["1"]["kind"] == "time to target"
    assert checks["1"]["verdict"] == "fail", checks["1"]
    assert exported(study).number == 0  # the baseline, never the unproven larger batch


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_a_failed_class_is_checked_during_the_search_and_never_run_again(tmp_path: Path) -> None:
    """8 -> 64 at the same lr (--lr-scaling none) cannot reach the baseline's loss in 3x its samples: its
    class fails as soon as it leads, and every later proposal in it, in this search and after a resume, is
    told infeasible without running."""
    space = tmp_path / "space.yaml"
    space.write_text("knobs:\n  batch_size: [8, 64]\n  num_threads: [1, 2]\n")
    base = HEALTHY.replace(warmup_steps=1, timed_steps=6, window=2, lr_scaling="none")
    settings = SearchSettings(
        budget_s=None,
        n_trials=4,
        storage=str(tmp_path / "studies.db"),
        space=str(space),
        studies_dir=str(tmp_path / "studies"),
        base=base,
        parity_steps=10,
        confirm_rounds=0,
        sampler="auto",
        seed=0,
    )
    said: list[str] = []
    session = SearchSession.create(settings, warm=True, say=said.append)  # forked trials and checks
    session.run()
    label = "global batch 8 -> 64"
    check = records.class_checks(session.study).get(label)
    assert check is not None and check["verdict"] == "fail" and check["kind"] == "time to target", said
    # its first trial carried the check (search/checks/riding.py): no check run of its own
    assert any(line.startswith(f"check: {label}: FAILS") and "own run" in line for line in said), said
    # One trial run per later run: the re-proposal is asked (and written off) before any other trial runs.
    later = dataclasses.replace(settings, n_trials=1)
    for resume in (False, True):
        if resume:
            session = SearchSession.create(later, warm=True, say=said.append)
        else:
            session.settings = later
        session.study.enqueue_trial({"batch_size": 64, "num_threads": 2})  # the sampler proposes it again
        session.run()
        again = [
            t
            for t in session.study.trials
            if t.number > check["trial"] and TrialRecord.from_frozen(t).config.get("batch_size") == 64
        ]
        assert again and all(TrialRecord.from_frozen(t).reason == "class_failed" for t in again), again
        assert all(t.constraints == {FEASIBLE_KEY: 1.0} for t in again)
        assert not any((Path(settings.studies_dir) / "autotune" / f"trial-{t.number}").exists() for t in again)
    summary = checks_summary(session.study)
    assert summary is not None and summary["classes"][label]["verdict"] == "fail"
    # the class's first trial ran; the re-proposals after its verdict were written off, not run
    assert summary["trials_in_failed_classes"] >= 1 and summary["written_off"] >= 2
    assert summary["check_seconds"] == 0  # its first trial carried the check: no seconds of its own
    assert 0 < summary["share_of_trial_time_in_failed_classes"] < 1
