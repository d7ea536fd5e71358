"""A framework job's baseline is the user's job as written: trial 0 runs the knobs read from their
TrainingArguments (or their datamodule's DataLoader), and a study whose best is that baseline exports
no change, only a line saying their settings were already the fastest measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune import pipelines
from autotune.apply.export import render
from autotune.core.config import TrialConfig, baseline_of
from autotune.core.configfile import Export
from autotune.pipelines.frameworks import hf
from autotune.search.store.records import TrialRecord
from autotune.trial.loop import worker
from tests.pipelines.framework_helpers import SHORT_SEARCH, autotune, ok, trials

transformers = pytest.importorskip("transformers")
pl = pytest.importorskip("lightning.pytorch")

HERE = "tests.pipelines.test_framework_baseline"
HF_SPEC, LIGHTNING_SPEC = f"hf:{HERE}:fused_16", f"lightning:{HERE}:loader_16"
# One compute thread and a few steps: a trial as test_hf.py runs one in this process.
SHORT = {"warmup_steps": 1, "timed_steps": 2, "window": 1, "num_threads": 1}


def fused_16(cfg: Any) -> tuple[Any, Any, Any, Any]:
    """A user's Trainer job: fused AdamW (transformers' own default), 16 per device, one loader worker."""
    from tests.pipelines import hf_jobs

    args = transformers.TrainingArguments(
        output_dir="out",
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        optim="adamw_torch_fused",
        dataloader_num_workers=1,
        report_to="none",
    )
    return hf_jobs._model(cfg.seed), hf_jobs._tokens(cfg.seed), transformers.default_data_collator, args


class Loader16(pl.LightningDataModule):
    """The tests' toy data, loaded 16 at a time by one pinned worker that prefetches 3 batches."""

    def __init__(self, seed: int) -> None:
        from tests.pipelines import lightning_jobs

        super().__init__()
        self.toy = lightning_jobs.Toy(seed)

    def setup(self, stage: str) -> None:
        self.toy.setup(stage)

    def train_dataloader(self) -> Any:
        from torch.utils.data import DataLoader

        return DataLoader(self.toy.train, batch_size=16, num_workers=1, pin_memory=True, prefetch_factor=3)


def loader_16(cfg: Any) -> tuple[Any, Any]:
    from tests.pipelines import lightning_jobs

    return lightning_jobs.Classifier(), Loader16(cfg.seed)


def test_the_hf_baseline_is_the_users_training_arguments(repo_on_path: Path) -> None:
    job = pipelines.load_pipeline(TrialConfig(pipeline=HF_SPEC))
    own = pipelines.own_baseline(job)
    assert own == {
        "batch_size": 16,
        "precision": "fp32",
        "num_workers": 1,
        "pin_memory": True,  # dataloader_pin_memory's own default
        "persistent_workers": False,
        "prefetch_factor": None,
        "compile": "off",
        "checkpoint_segments": 0,
        "optimizer_fusion": "fused",
    }
    # Trial 0 then passes the user's own fields back: nothing differs, on a CPU or a GPU.
    base = baseline_of(TrialConfig(pipeline=HF_SPEC, baseline=own))
    for cuda in (False, True):
        assert hf.changes(job.args, hf.tuned_fields(base, job.args, cuda, job.unsupported)) == {}


def test_a_knob_the_job_cannot_express_is_not_read(repo_on_path: Path) -> None:
    """SGD is no AdamW kernel: optimizer_fusion stays out of the baseline, so the baseline check passes."""
    job = pipelines.load_pipeline(TrialConfig(pipeline="hf:tests.pipelines.hf_jobs:sgd"))
    own = pipelines.own_baseline(job)
    assert "optimizer_fusion" not in own and own["batch_size"] == 8
    pipelines.load_pipeline(TrialConfig(pipeline="hf:tests.pipelines.hf_jobs:sgd", baseline=own))


def test_a_batch_that_does_not_divide_the_global_batch_is_left_out(repo_on_path: Path) -> None:
    job = pipelines.load_pipeline(TrialConfig(pipeline=HF_SPEC))
    assert "batch_size" not in pipelines.own_baseline(job, global_batch=24)
    assert pipelines.own_baseline(job, global_batch=32)["batch_size"] == 16


def test_a_plain_pipeline_has_no_own_baseline(repo_on_path: Path) -> None:
    """autotune owns a plain pipeline's loop: its baseline stays plain PyTorch (or --baseline)."""
    tiny = pipelines.load_pipeline(TrialConfig(pipeline="tests.fault_pipelines:tiny"))
    assert pipelines.own_baseline(tiny) == {}


def test_the_lightning_baseline_is_the_datamodules_loader(repo_on_path: Path) -> None:
    job = pipelines.load_pipeline(TrialConfig(pipeline=LIGHTNING_SPEC))
    assert pipelines.own_baseline(job) == {
        "batch_size": 16,
        "num_workers": 1,
        "pin_memory": True,
        "persistent_workers": False,
        "prefetch_factor": 3,
    }


SEEN_CLIPS: list[Any] = []


def _with_trainer(trainer_kwargs: dict[str, Any]) -> Any:
    """A factory that also returns the user's own Trainer arguments."""

    def make(cfg: Any) -> tuple[Any, Any, dict[str, Any]]:
        from tests.pipelines import lightning_jobs

        class ClipSeen(lightning_jobs.Classifier):
            def on_train_start(self) -> None:  # what the trial's Trainer kept of the user's own
                SEEN_CLIPS.append(self.trainer.gradient_clip_val)

        return ClipSeen(), Loader16(cfg.seed), trainer_kwargs

    return make


bf16_trainer = _with_trainer({"precision": "bf16-mixed", "benchmark": True, "gradient_clip_val": 0.5})
bf16_true_trainer = _with_trainer({"precision": "bf16-true"})
accumulating_trainer = _with_trainer({"accumulate_grad_batches": 2})


def test_the_lightning_baseline_is_the_users_trainer_and_loader(repo_on_path: Path) -> None:
    """Trial 0 runs the user's Trainer precision and keeps the rest of their Trainer (gradient clipping)."""
    spec = f"lightning:{HERE}:bf16_trainer"
    own = pipelines.own_baseline(pipelines.load_pipeline(TrialConfig(pipeline=spec)))
    assert own["precision"] == "bf16" and own["cudnn_benchmark"] is True and own["batch_size"] == 16
    SEEN_CLIPS.clear()
    result = worker.run(baseline_of(TrialConfig(pipeline=spec, baseline=own, **SHORT)))
    assert result.status == "ok", result
    assert result.applied["precision"]["in_effect"] == "bf16"
    assert SEEN_CLIPS == [0.5]


def test_a_lightning_trainer_autotune_cannot_reproduce_is_bad_input(repo_on_path: Path) -> None:
    from autotune.core.errors import PipelineError

    for name, said in (("bf16_true_trainer", "bf16-true"), ("accumulating_trainer", "--global-batch")):
        job = pipelines.load_pipeline(TrialConfig(pipeline=f"lightning:{HERE}:{name}"))
        with pytest.raises(PipelineError, match=said):
            pipelines.own_baseline(job)
    # With the study's global batch it is no error: every trial accumulates to that batch.
    job = pipelines.load_pipeline(TrialConfig(pipeline=f"lightning:{HERE}:accumulating_trainer"))
    assert pipelines.own_baseline(job, global_batch=32)["batch_size"] == 16


def _best_is_baseline(spec: str) -> Export:
    """The export of a study whose best is trial 0: the baseline read from the job, run as a trial."""
    cfg = TrialConfig(pipeline=spec, **SHORT)
    cfg = cfg.replace(baseline=pipelines.own_baseline(pipelines.load_pipeline(cfg)))
    result = worker.run(baseline_of(cfg))
    assert result.status == "ok", result
    best = baseline_of(cfg)
    return Export(
        config=best,
        speedup=1.0,
        environment={"device": "cpu"},
        study={"name": "s", "trial": 0},
        framework=result.applied["framework"],
    )


def test_an_hf_study_whose_best_is_the_baseline_changes_nothing(repo_on_path: Path) -> None:
    e = _best_is_baseline(HF_SPEC)
    assert e.framework is not None and e.framework["training_args"] == {}
    text = render("hf", e)
    assert "training_args = dict()  # your base arguments were already the fastest measured" in text
    assert "yours:" not in text and "optim=" not in text


def test_a_lightning_study_whose_best_is_the_baseline_changes_nothing(repo_on_path: Path) -> None:
    text = render("lightning", _best_is_baseline(LIGHTNING_SPEC))
    assert "were already the fastest measured" in text
    assert "precision=" not in text and "batch_size=" not in text
    ns: dict[str, Any] = {}
    exec(text, ns)  # still pastes: the two dicts are there, empty
    assert ns["trainer_kwargs"] == {} and ns["dataloader_kwargs"] == {}


def test_a_search_measures_the_users_job_and_exports_no_change(tmp_path: Path) -> None:
    """The real CLI, one trial: trial 0 is the job as written, said in one line, and its export keeps it."""
    run = autotune(
        "search", "--pipeline", HF_SPEC, "--budget", "2m", "--n-trials", "1", *SHORT_SEARCH[2:], cwd=tmp_path
    )
    ok(run)
    said = next(line for line in run.stdout.splitlines() if line.startswith("baseline: your job as written: "))
    assert "batch_size 16," in said and "optimizer_fusion fused" in said
    baseline = trials(tmp_path / "studies.db", "autotune")[0]  # trial 0 (the rest: enqueued, not run)
    assert TrialRecord.of(baseline).knob_values()["optimizer_fusion"] == "fused"
    export = autotune("export", "--format", "hf", cwd=tmp_path)
    ok(export)
    assert "already the fastest measured" in export.stdout and "yours:" not in export.stdout
