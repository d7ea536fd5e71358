"""`--pipeline hf:MODULE:FACTORY`: a trial is transformers' own Trainer.train on the user's model, dataset
and collator, the knobs as TrainingArguments fields over the user's own, measured by a TrainerCallback; a
search runs end to end on the docs' example, and its export is the fields that differ from the base."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main
from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import worker
from tests.pipelines.framework_helpers import (
    autotune,
    doc_commands,
    doc_example,
    no_trial_broke,
    ok,
    round_trips,
    with_short_budget,
)

transformers = pytest.importorskip("transformers")

SPEC = "hf:tests.pipelines.hf_jobs:make"


def trial(spec: str = SPEC, **knobs: Any) -> Any:
    """One trial in this process, as a forked trial runs it: the real Trainer.train, the real callback (one
    compute thread: on a small shared machine two threads run a step many times slower)."""
    knobs = {"warmup_steps": 1, "timed_steps": 3, "window": 1, "num_threads": 1, **knobs}
    return worker.run(TrialConfig(pipeline=spec, **knobs))


def test_an_in_process_trial_leaves_no_scratch_folder(
    tmp_path: Path, repo_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a progress file the Trainer's output_dir is a temporary folder, removed when the trial ends."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert trial().status == "ok"
    assert list(tmp_path.glob("autotune-trial-*")) == []


def test_a_trial_is_trainer_train_with_the_knobs(tmp_path: Path, repo_on_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    cfg = TrialConfig(
        pipeline=SPEC,
        batch_size=4,
        global_batch=8,
        num_workers=1,
        checkpoint_segments=1,
        optimizer_fusion="fused",
        warmup_steps=2,
        timed_steps=4,
        window=2,
        num_threads=1,
    )
    result = worker.run(cfg, progress)
    a = result.applied
    # Read back from the Trainer's own objects: its DataLoader, its optimizer, the model it checkpoints.
    assert a["batch_size"]["in_effect"] == 4 and a["num_workers"]["in_effect"] == 1
    assert a["grad_accum"]["in_effect"] == 2
    assert a["checkpoint_segments"]["in_effect"] == 1
    assert a["optimizer_fusion"]["in_effect"] == "fused"
    assert "AdamW" in a["optimizer_fusion"]["why"] and "'fused': True" in a["optimizer_fusion"]["why"]
    assert a["precision"] == {
        "requested": "fp32",
        "in_effect": "fp32",
        "why": "TrainingArguments(bf16=False, fp16=False)",
    }
    base = transformers.TrainingArguments(
        output_dir="out", per_device_train_batch_size=8, learning_rate=3e-3, report_to="none"
    )
    checkpointing = (
        "activation_checkpointing" if hasattr(base, "activation_checkpointing") else "gradient_checkpointing"
    )
    want = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "dataloader_num_workers": 1,
        # dataloader_prefetch_factor 2 is not listed: it is what the base's None runs with one worker.
        checkpointing: True,
        "optim": "adamw_torch_fused",
    }
    changed = {k: v for k, v in want.items() if getattr(getattr(base, k), "value", getattr(base, k)) != v}
    assert a["framework"]["library"] == "hf" and a["framework"]["training_args"] == changed
    assert a["framework"]["base"]["per_device_train_batch_size"] == 8
    # Warm-up untimed, and one more step draining the 1 worker x prefetch 2 batches made ahead (2 a step).
    assert result.timed_steps == 4 and len(result.losses) == 2 + 1 + 4 and all(map(math.isfinite, result.losses))
    assert len(result.windows) == 2 and len(progress.read_text().splitlines()) == 2
    assert result.samples_per_s > 0 and result.step_time_p50 > 0 and 0 <= result.data_wait_fraction < 1


def test_the_scaled_lr_is_the_users_own(repo_on_path: Path) -> None:
    a = trial(batch_size=32, warmup_steps=0, timed_steps=1).applied
    # Global batch 32 against the reference 8: the base learning_rate 3e-3 x sqrt(4).
    assert a["lr"]["requested"] == 3e-3 and a["lr"]["in_effect"] == pytest.approx(6e-3)
    assert a["framework"]["training_args"]["learning_rate"] == pytest.approx(6e-3)


def test_losses_follow_the_seeds_as_parity_needs(repo_on_path: Path) -> None:
    base = trial(warmup_steps=0, timed_steps=2).losses
    assert len(base) == 2
    assert trial(warmup_steps=0, timed_steps=2).losses == base
    assert trial(warmup_steps=0, timed_steps=2, data_seed=1).losses != base


def test_a_base_optimizer_the_knob_cannot_express(repo_on_path: Path) -> None:
    from autotune.pipelines import load_pipeline, unsupported_of

    job = load_pipeline(TrialConfig(pipeline="hf:tests.pipelines.hf_jobs:sgd"))
    assert unsupported_of(job).why["optimizer_fusion"].startswith("the base TrainingArguments train with optim='sgd'")
    with pytest.raises(TrialUnsupported, match="optimizer_fusion"):
        trial("hf:tests.pipelines.hf_jobs:sgd", optimizer_fusion="fused")


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--pipeline", "hf:tests.pipelines.hf_jobs:three_parts"],
            "returned tuple (GPT2LMHeadModel, list, TrainingArguments), expected (model, train_dataset, data_collator, "
            "TrainingArguments)",
        ),
        (
            ["--pipeline", SPEC, "--baseline", '{"set_to_none": false}'],
            "--baseline sets set_to_none, which --pipeline 'hf:tests.pipelines.hf_jobs:make' cannot express",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    repo_on_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    says: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["search", "--budget", "1m", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err and says in err, err
    assert not (tmp_path / "studies.db").exists()


def test_transformers_not_installed_is_bad_input(
    tmp_path: Path, repo_on_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)
    code = main(["search", "--budget", "1m", "--pipeline", SPEC])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "needs transformers, which cannot be imported" in err and "pip install 'autotune[frameworks]'" in err, err


@pytest.mark.slow
def test_docs_example_searches_exports_and_round_trips(tmp_path: Path) -> None:
    """The docs' transformers example as written: its module, its search (with the suite's short
    budget), its export and its re-measurement."""
    (tmp_path / "my_hf.py").write_text(doc_example("my_hf.py"))
    search, export, again = doc_commands("my_hf")
    run = autotune(*with_short_budget(search), cwd=tmp_path, pythonpath=tmp_path)
    ok(run)
    assert (
        "channels_last not searched: not supported by this pipeline: TrainingArguments has no memory-layout "
        "field" in run.stdout
    ), run.stdout
    assert "checkpoint_segments: choices limited to [0, 1]" in run.stdout, run.stdout
    no_trial_broke(tmp_path / "studies.db", "hf")

    ok(autotune(*export, cwd=tmp_path, pythonpath=tmp_path))
    best = tmp_path / "studies" / "hf" / "best.yaml"
    exported = yaml.safe_load(best.read_text())
    assert exported["workload"]["pipeline"] == "hf:my_hf:make" and exported["framework"]["library"] == "hf"
    # Ready to paste: the user's base arguments take the tuned fields as they are.
    tuned: dict[str, Any] = {}
    exec((tmp_path / "tuned_hf.py").read_text(), tuned)
    assert tuned["training_args"] == exported["framework"]["training_args"]
    import dataclasses

    base = transformers.TrainingArguments(
        output_dir="out", per_device_train_batch_size=8, learning_rate=5e-4, num_train_epochs=1, report_to="none"
    )
    args = dataclasses.replace(base, **tuned["training_args"])
    assert args.per_device_train_batch_size == exported["config"]["batch_size"]

    ok(autotune(*again, cwd=tmp_path, pythonpath=tmp_path))
    round_trips(best, tmp_path / "studies" / "hf" / "trial" / "result.json")


def test_the_trial_observes_what_a_layer_computed_in_and_where_the_optimizer_steps(repo_on_path: Path) -> None:
    """applied.observed (scripts/gpu_check.sh's hf row asserts it on a GPU): lm_head's output under accelerate's
    autocast (the model's own output it casts back to float32), the parameters' device, the fused optimizer."""
    seen = trial(precision="bf16", optimizer_fusion="fused").applied["observed"]
    assert seen["output_dtype"] == "bfloat16" and seen["output_of"] == "lm_head (Linear)"
    assert seen["param_device"] == "cpu" and seen["optimizer_fused"] is True
    assert seen["optimizer_step_device"] == "cpu"  # the parameters' device: on a GPU, the GPU
    assert trial().applied["observed"]["output_dtype"] == "float32"
