"""The export of a framework study is the user's own objects, tuned, as the winning trial passed them:
Trainer and DataLoader keyword arguments for Lightning, the changed TrainingArguments fields for HF."""

from __future__ import annotations

from typing import Any

import torch
import yaml

from autotune.apply.export import render
from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.configfile import Export, to_yaml

LIGHTNING = {
    "library": "lightning",
    "trainer_kwargs": {
        "accelerator": "cpu",
        "devices": 1,
        "strategy": "auto",
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
        "benchmark": False,
    },
    "dataloader_kwargs": {
        "batch_size": 16,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": True,
        "prefetch_factor": 4,
    },
    "lr_scale": 0.5,
}
HF = {
    "library": "hf",
    "training_args": {"per_device_train_batch_size": 16, "dataloader_num_workers": 2},
    "base": {"per_device_train_batch_size": 8, "dataloader_num_workers": 0},
}


def export(framework: dict[str, Any], **knobs: Any) -> Export:
    result = TrialResult(status="ok", samples_per_s=10.0, applied={"framework": framework})
    return Export.from_result(
        TrialConfig(pipeline=f"{framework['library']}:m:make", **knobs),
        result,
        baseline_samples_per_s=5.0,
        study={"name": "s", "trial": 3},
    )


def run(code: str) -> dict[str, Any]:
    names: dict[str, Any] = {}
    exec(code, names)  # ready to paste: it runs as written
    return names


def test_lightning_study_exports_the_trainer_arguments_it_ran() -> None:
    e = export(LIGHTNING, batch_size=16, num_workers=2, num_threads=1)
    code = render("lightning", e)
    names = run(code)
    assert names["trainer_kwargs"] == LIGHTNING["trainer_kwargs"]
    assert names["dataloader_kwargs"] == LIGHTNING["dataloader_kwargs"]
    assert "x2.00 samples/s" in code and "multiply your learning rate by 0.5" in code
    assert "torch.set_num_threads(1)" in code
    assert "optimizer_fusion: not tuned, the LightningModule builds its own optimizer" in code
    # best.yaml keeps the same record in its framework: section.
    assert yaml.safe_load(to_yaml(e))["framework"] == LIGHTNING


def test_hf_study_exports_the_fields_that_differ_from_the_base() -> None:
    code = render("hf", export(HF, batch_size=16, num_workers=2))
    assert run(code)["training_args"] == HF["training_args"]
    assert "per_device_train_batch_size=16,  # yours: 8" in code


def test_the_process_knobs_a_framework_trial_set_are_written_beside_its_arguments() -> None:
    """A framework trial sets TF32, cudnn.benchmark and the threads in its own process, and runs one per GPU:
    the Trainer's arguments hold none of TF32 and the launch (TrainingArguments not cudnn's either), so the
    export sets them as its code runs, and says the launch."""
    flags = (
        (torch.backends.cuda.matmul, "allow_tf32"),
        (torch.backends.cudnn, "allow_tf32"),
        (torch.backends.cudnn, "benchmark"),
    )
    before, threads = [getattr(o, a) for o, a in flags], torch.get_num_threads()
    try:
        for framework in (LIGHTNING, HF):
            for o, a in flags:
                setattr(o, a, False)
            code = render(
                framework["library"], export(framework, tf32=True, cudnn_benchmark=True, gpus=2, num_threads=1)
            )
            run(code)
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32, code
            assert torch.backends.cudnn.benchmark is (framework is HF), code  # Lightning's is its Trainer's benchmark
            assert torch.get_num_threads() == 1 and "torchrun --nproc-per-node 2" in code, code
    finally:
        for (o, a), value in zip(flags, before):
            setattr(o, a, value)
        torch.set_num_threads(threads)


def test_another_format_or_a_plain_study_keeps_the_generic_rendering() -> None:
    generic = render("hf", export(LIGHTNING))  # a Lightning study rendered for HF: the knob-by-knob form
    assert "training_args = dict(" in generic and "per_device_train_batch_size=8" in generic
    plain = Export.from_result(TrialConfig(), TrialResult(status="ok", samples_per_s=1.0))
    assert plain.framework is None and "framework" not in yaml.safe_load(to_yaml(plain))
