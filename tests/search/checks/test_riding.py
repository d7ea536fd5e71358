"""search/checks/riding.py: a class's check rides on its trials. Trial 0 and the baseline's second draw (data
seed + 1) are the reference, a class's first trial records the losses its verdict needs, and the verdict is
the class's: no check process starts for it, even where the budget left could not pay for one, and a resumed
study reuses the verdict.

Every speed difference is built into the pipeline (tests/parity_pipelines.fast_in_bf16: each fp32 step waits
100 ms more), and a separate check is priced beyond any budget (classes.cost_s), so what the budget pays for
is decided by construction, never by this machine's speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.outcomes import Verdict
from autotune.core.settings import SearchSettings
from autotune.search.checks import classes, parity
from autotune.search.loop import runner
from autotune.search.loop.session import SearchSession
from autotune.search.space.machine import cpu_bf16_native
from autotune.search.store import records
from autotune.search.store.records import TrialRecord

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("repo_on_path")]
BASE = TrialConfig(
    pipeline="tests.parity_pipelines:fast_in_bf16", image_size=32, warmup_steps=1, timed_steps=4, window=2
)
K = 12  # more steps than a trial's window: trial 0, the draw and the class's first trial run on to them


def spies(monkeypatch: pytest.MonkeyPatch) -> tuple[list[TrialConfig], list[TrialConfig]]:
    """(the check processes started: parity's reference and candidate runs, the trials' configs as run); a
    separate check is priced beyond the budget, as on a slow machine."""
    checks: list[TrialConfig] = []
    trials: list[TrialConfig] = []
    real_check, real_trial = parity.locked_trial, runner.locked_trial

    def check_run(cfg: TrialConfig, *a: Any, **kw: Any) -> Any:
        checks.append(cfg)
        return real_check(cfg, *a, **kw)

    def trial_run(cfg: TrialConfig, *a: Any, **kw: Any) -> Any:
        trials.append(cfg)
        return real_trial(cfg, *a, **kw)

    monkeypatch.setattr(parity, "locked_trial", check_run)
    monkeypatch.setattr(runner, "locked_trial", trial_run)
    monkeypatch.setattr(classes, "cost_s", lambda *_: 1e6)
    # Another job on this machine would make a trial contended and re-measured: a path these tests are not about.
    monkeypatch.setattr(runner, "contended_cpus", lambda: float("inf"))
    return checks, trials


def settings(tmp_path: Path, space: str, **kw: Any) -> SearchSettings:
    (tmp_path / "space.yaml").write_text(space)
    return SearchSettings(
        **{
            "budget_s": 600.0,
            "storage": str(tmp_path / "studies.db"),
            "space": str(tmp_path / "space.yaml"),
            "studies_dir": str(tmp_path / "studies"),
            "study": "riding",
            "base": BASE,
            "parity_steps": K,
            "confirm_rounds": 3,
            "confirm_top": 2,
            "n_trials": 3,
            **kw,
        }
    )


def test_a_precision_class_is_checked_from_its_own_trial_and_exported_with_no_check_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not cpu_bf16_native():
        pytest.skip("the space drops bf16 on a CPU without native bf16")
    checks, trials = spies(monkeypatch)
    said: list[str] = []
    s = settings(tmp_path, "knobs:\n  precision: [fp32, bf16]\n")
    session = SearchSession.create(s, warm=True, say=said.append)
    report = session.run()
    study = session.study
    assert checks == [], said  # no reference run, no candidate run: the trials carried both
    # trial 0 and the class's first trial ran on, untimed, to the reference's K steps; the second draw too
    assert trials[0].precision == "fp32" and trials[0].record_steps == K
    first = next(n for n, cfg in enumerate(trials) if cfg.precision == "bf16")
    assert trials[first].record_steps == K
    reference = records.parity_reference(study)
    # what the reference cost is its runs' steps past their windows (none where a window held K); no check paid
    assert reference is not None and reference["steps"] == K and reference["seconds"] >= 0.0 and reference["carried"]
    assert reference["losses"] != reference["twin_losses"]  # the twin trained another data order
    check = records.class_checks(study)["precision fp32 -> bf16"]
    assert check["kind"] == "parity" and check["verdict"] == Verdict.PASS, check
    assert check["runs"] == 0 and check["trial"] == first and "own run" in check["reason"]
    # what the verdict cost: the steps its trial ran past its window
    assert check["seconds"] == pytest.approx(TrialRecord.from_frozen(study.trials[first]).metrics["record_s"], abs=0.1)
    assert any(line.startswith("check: precision fp32 -> bf16: passes") for line in said), said
    # confirmed in 3 rounds beside the baseline, and exported
    assert report.confirmation is not None and report.confirmation["rounds"] >= 3
    assert report.best_yaml is not None
    best = yaml.safe_load(report.best_yaml.read_text())
    assert best["config"]["precision"] == "bf16", said

    # A resumed study reuses the stored verdict and reference: nothing is trained again to check the class, and
    # no later trial of it, nor the baseline, runs on for a check's losses.
    again: list[str] = []
    before = len(trials)
    resumed = SearchSession.create(s, warm=True, say=again.append)
    resumed.run()
    assert checks == [] and records.class_checks(resumed.study)["precision fp32 -> bf16"] == check, again
    assert records.parity_reference(resumed.study) == reference
    # (its space may be spent by then: no trial at all is as good as none that runs on)
    assert all(cfg.record_steps == 0 for cfg in trials[before:]), trials[before:]


def test_a_class_that_changes_the_step_is_judged_to_target_from_its_own_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 32 waits the fp32 step's 100 ms once for 4x the samples: x4 by construction. Its first trial trains
    the time-to-target cap (3x the reference's samples) and its verdict is the class's, no process of its own."""
    checks, trials = spies(monkeypatch)
    said: list[str] = []
    s = settings(tmp_path, "knobs:\n  batch_size: [8, 32]\n  precision: [fp32]\n", parity_steps=20)
    session = SearchSession.create(s, warm=True, say=said.append)
    report = session.run()
    study = session.study
    assert checks == [], said
    label = "global batch 8 -> 32; lr 0.001 -> 0.002 (sqrt rule)"
    check = records.class_checks(study)[label]
    first = next(n for n, cfg in enumerate(trials) if cfg.batch_size == 32)
    assert trials[first].record_steps == parity.steps_for(3 * 20 * 8, 32)  # CAP x the reference's samples
    assert check["kind"] == "time to target" and check["runs"] == 0 and check["trial"] == first, check
    assert check["verdict"] == Verdict.PASS and check["speedup_to_target"] > 1, check
    assert report.best_yaml is not None
    assert yaml.safe_load(report.best_yaml.read_text())["config"]["batch_size"] == 32, said
