"""The end of a search measures how far the export is from the limit, when the budget left pays for it:
best.yaml's `ceiling:` section with each figure and how it was measured, shown by `show` and the report;
skipped with its reason otherwise."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.apply.display import ceiling_note, leaderboard_table
from autotune.apply.report import _summary
from autotune.core.configfile import to_yaml
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.loop import export_ceiling
from autotune.trial.probes import ceiling as measuring
from autotune.search.loop.session import SearchSession
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.storage import open_storage
from autotune.search.store.results import best_export, exported
from tests.search.store.test_results import TINY, study_with

MEASURED = {
    "end_to_end_samples_per_s": 8.0,
    "compute_only_samples_per_s": 10.0,
    "lost_to_data_wait": 0.2,
    "ceiling_method": "one process: 3 steps from the loader then 3 on 2 cached batches",
    "utilisation": 0.012,
    "peak_flops_per_s": 5e10,
    "peak_dtype": "float32",
}


def test_a_budget_that_cannot_pay_for_it_skips_it_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(measuring.CEILING_ENV, "1")
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 20.0)])
    settings = SearchSettings(budget_s=60, studies_dir=str(tmp_path / "s"), base=TINY)
    spent = Budget.of(settings, started=time.monotonic() - 10_000)
    said: list[str] = []
    section = export_ceiling.run(study, settings, spent, say=said.append)
    assert section is not None and "cannot pay for it" in section["skipped"]
    assert not (tmp_path / "s" / "c" / "ceiling").exists()  # nothing was started
    written = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert "cannot pay for it" in written["ceiling"]["skipped"]
    assert any("ceiling: not measured" in s for s in said)


def test_need_grows_with_the_exported_steps_time(tmp_path: Path) -> None:
    fast = TrialRecord(role="search", metrics={"step_time_p50": 0.01})
    slow = TrialRecord(role="search", metrics={"step_time_p50": 2.0})
    assert export_ceiling.need_s(slow) > export_ceiling.need_s(fast) + 5 * 2.0


def test_a_ceiling_is_exported_only_with_the_trial_it_was_measured_for(tmp_path: Path) -> None:
    """Kept on the study with its trial: every export of that trial has it (search, `export`), `show` and
    the report read it wherever they run; a previous run's export's ceiling is not this one's."""
    study = study_with(tmp_path, [("baseline", {}, 10.0), ("search", {"num_workers": 1}, 20.0)])
    best = exported(study)
    assert best is not None
    records.write_ceiling(study, best.number + 1, MEASURED)  # a previous run's export
    assert "ceiling" not in yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert ceiling_note(study) is None
    records.write_ceiling(study, best.number, MEASURED)
    written = yaml.safe_load(to_yaml(best_export(study, None, None)))
    assert written["ceiling"] == MEASURED
    note = ceiling_note(study)
    assert note is not None and f"exported trial {best.number}" in note
    assert "compute-only 10.00 samples/s" in note and "20% lost to data wait" in note and "1.2%" in note
    assert "contended" not in note
    assert "contended: other processes kept 1.5 CPUs busy" in export_ceiling.summary(
        {**MEASURED, "others_cpu": 1.5, "contended": True}
    )
    assert note in leaderboard_table(study).title  # `autotune show` and the end of a search
    assert ("ceiling", note) in _summary(study, 10.0)  # the report's summary


def test_a_framework_pipeline_says_why_it_has_no_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(measuring.CEILING_ENV, "1")
    assert "own loop" in (measuring.why_not(TINY.replace(pipeline="lightning:my.module:Model")) or "")
    assert measuring.why_not(TINY) is None


@pytest.mark.slow
def test_a_tiny_search_exports_its_ceiling_with_how_it_was_measured(
    tmp_path: Path, repo_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(measuring.CEILING_ENV, "1")  # the suite turns it off elsewhere (tests/conftest.py)
    settings = SearchSettings(
        budget_s=600,
        n_trials=2,
        storage=str(tmp_path / "studies.db"),
        studies_dir=str(tmp_path / "studies"),
        base=TINY,
        confirm_rounds=1,
        confirm_top=1,
        parity_steps=0,
    )
    said: list[str] = []
    outcome = SearchSession.create(settings, warm=True, say=said.append).run()
    assert outcome.best_yaml is not None
    written = yaml.safe_load(outcome.best_yaml.read_text())
    c = written["ceiling"]
    assert c["compute_only_samples_per_s"] > 0 and c["end_to_end_samples_per_s"] > 0
    assert 0.0 <= c["lost_to_data_wait"] < 1.0
    assert "cached batches" in c["ceiling_method"] and f"{TINY.image_size} px" in c["ceiling_method"]
    assert c["flops_per_sample"] > 0 and "FlopCounterMode" in c["flops_method"]
    # The peak is probed at the precision the exported config's matmuls and convolutions run in.
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[written["config"]["precision"]]
    assert "torch.mm" in c["peak_method"] and c["peak_dtype"] == dtype and c["probe_size"] >= 256
    assert 0 < c["utilisation"] < 1 and isinstance(c["contended"], bool)
    assert any(s.startswith("ceiling: compute-only") for s in said)
    study = optuna.load_study(study_name="autotune", storage=open_storage(settings.storage))
    assert records.ceiling(study, written["study"]["trial"]) == c  # on the study, with its trial
    print(yaml.safe_dump({"ceiling": c}, sort_keys=False))
