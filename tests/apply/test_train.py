"""autotune train: real epochs, validation IoU, checkpoints that load into the plain model, --compare-baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml

from autotune.apply import train
from autotune.cli import build_parser
from autotune.core.config import TrialConfig
from autotune.core.errors import AutotuneError
from tests.apply.train_pipelines import ValidatedTiny

pytestmark = pytest.mark.side_by_side


VALIDATED_TINY = "tests.apply.train_pipelines:validated_tiny"


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def write_config(path: Path, **knobs: object) -> Path:
    # An exported best.yaml's shape: knobs under config:, the workload beside them.
    path.write_text(yaml.safe_dump({"config": knobs, "workload": {"image_size": 64}}))
    return path


def plain_unet(data: Path) -> torch.nn.Module:
    from autotune.pipelines.unet.pipeline import UnetPipeline

    return UnetPipeline(TrialConfig(data_dir=str(data), image_size=64)).build_model()


def test_help_is_honest_about_processes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(["train", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("--compare-baseline", "fresh process", "torchrun", "validation IoU", "data loading included"):
        assert phrase in text


def test_plain_state_dict_strips_wrappers() -> None:
    from autotune.trial.loop.knobs.checkpoint_segments import CheckpointedStage

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0] = CheckpointedStage(model[0])
    keys = set(train.plain_state_dict(model))
    assert keys == {"0.weight", "0.bias", "1.weight", "1.bias"}


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_compare_baseline_one_epoch(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # bf16 + fused AdamW + one checkpointed stage + channels_last, batch 4: the baseline is fp32, batch 8.
    # A two-conv net, not the Unet: four fresh processes train here, and what is checked is train's own
    # mechanics (test_ddp_two_processes trains the Unet).
    cfg = write_config(
        tmp_path / "best.yaml",
        precision="bf16",
        optimizer_fusion="fused",
        batch_size=4,
        checkpoint_segments=1,
        channels_last=True,
    )
    out = tmp_path / "out"
    args = parse(
        [
            "train",
            "--config",
            str(cfg),
            "--epochs",
            "1",
            "--pipeline",
            VALIDATED_TINY,
            "--compare-baseline",
            "--rounds",
            "2",
            "--out",
            str(out),
        ]
    )
    assert args.func(args) == 0
    text = capfd.readouterr().out
    print(text)  # the measured figures, kept in the test log
    assert "[config] epoch 1/1" in text and "[baseline] epoch 1/1" in text
    assert "samples/s" in text and "speedup: x" in text
    assert "final IoU: config" in text and "baseline" in text and "difference" in text
    # Global batch 4 vs the baseline's 8: twice the steps, and the lr scaled by sqrt(1/2), both said.
    assert "optimizer steps: config 6 (global batch 4, lr 0.000707), baseline 3 (global batch 8, lr 0.001)" in text

    # Two paired rounds, the second in the other order: each round's ratio, their median and range.
    assert text.index("[config] epoch 1/1") < text.index("[baseline] epoch 1/1")
    assert text.index("[baseline-2] epoch 1/1") < text.index("[config-2] epoch 1/1")
    assert "paired rounds: 2" in text and "verdict: " in text
    runs = json.loads((out / "train.json").read_text())
    assert [r["name"] for r in runs] == ["config", "baseline", "config-2", "baseline-2"]
    summary = runs[0]["comparison"]["paired"]
    assert summary["rounds"] == 2 and summary["speedups"] == pytest.approx(
        [runs[0]["samples_per_s"] / runs[1]["samples_per_s"], runs[2]["samples_per_s"] / runs[3]["samples_per_s"]]
    )
    tuned, base = runs[:2]
    assert tuned["config"]["precision"] == "bf16" and base["config"]["precision"] == "fp32"
    assert base["config"]["batch_size"] == 8 and base["config"]["image_size"] == 64  # same workload
    for r in runs[:2]:
        (epoch,) = r["history"]
        assert epoch["samples"] > 0 and epoch["seconds"] > 0 and 0.0 <= epoch["iou"] <= 1.0
        assert epoch["samples"] == 22  # every sample: the partial last batch is trained on, not dropped
        assert epoch["optimizer_steps"] == r["optimizer_steps"] == -(-22 // r["config"]["batch_size"])
        ckpt = torch.load(r["checkpoint"], map_location="cpu", weights_only=True)
        assert ckpt["config"]["precision"] == r["config"]["precision"] and ckpt["epochs"] == 1
        ValidatedTiny(TrialConfig()).build_model().load_state_dict(ckpt["model"])  # strict: no wrapper names left


@pytest.mark.slow
def test_bad_data_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cfg = write_config(tmp_path / "c.yaml", batch_size=2)
    args = parse(
        [
            "train",
            "--config",
            str(cfg),
            "--epochs",
            "1",
            "--data",
            str(tmp_path / "empty"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    with pytest.raises(AutotuneError, match="images"):
        args.func(args)


@pytest.mark.slow
def test_ddp_two_processes(tiny_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "ddp.yaml", gpus=2, batch_size=4)  # 3 steps a rank, the last one partial
    out = tmp_path / "out"
    args = parse(["train", "--config", str(cfg), "--epochs", "1", "--data", str(tiny_data), "--out", str(out)])
    assert args.func(args) == 0
    assert "DDP over 2 processes" in capfd.readouterr().out
    (run,) = json.loads((out / "train.json").read_text())
    assert run["world"] == 2 and run["history"][0]["samples"] == 22  # both ranks' shards: every sample
    plain_unet(tiny_data).load_state_dict(torch.load(run["checkpoint"], weights_only=True)["model"])


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_a_failing_ddp_rank_gives_its_own_exit_code_promptly(tmp_path: Path) -> None:
    import time

    cfg = TrialConfig(pipeline="tests.fault_pipelines:nan_rank1", gpus=2, batch_size=4)
    t0 = time.monotonic()
    with pytest.raises(train.TrainFailed, match="numerics: loss became nan") as e:
        train.run_config(cfg, 1, tmp_path / "out", "config", lambda s: None)
    assert e.value.code == 4  # not torchrun's 1
    assert time.monotonic() - t0 < 60, "rank 0 waited for rank 1 until torchrun reaped it"


@pytest.mark.usefixtures("repo_on_path")
def test_out_of_memory_in_train_exits_3_not_1(tmp_path: Path) -> None:
    with pytest.raises(train.TrainFailed, match="oom: CUDA out of memory") as e:
        train.run_config(
            TrialConfig(pipeline="tests.fault_pipelines:oom", batch_size=4),
            1,
            tmp_path / "out",
            "config",
            lambda s: None,
        )
    assert e.value.code == 3


def test_two_ranks_on_one_gpu_only_with_gloo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.trial.loop.knobs import DDP_BACKEND_ENV

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv(DDP_BACKEND_ENV, raising=False)
    cfg = TrialConfig(gpus=2)
    with pytest.raises(AutotuneError, match="AUTOTUNE_DDP_BACKEND=gloo"):
        train.run_config(cfg, 1, tmp_path, "config", lambda s: None)
    launched: list[list[str]] = []
    monkeypatch.setattr(train, "run_process", lambda cmd, *a, **kw: launched.append(cmd) or 0)
    monkeypatch.setenv(DDP_BACKEND_ENV, "gloo")
    with pytest.raises(train.TrainFailed):  # launched (the fake run leaves no summary behind)
        train.run_config(cfg, 1, tmp_path, "config", lambda s: None)
    assert "--nproc-per-node" in launched[0] and "2" in launched[0]


@pytest.mark.slow
@pytest.mark.usefixtures("repo_on_path")
def test_fsdp_training_validates_and_saves_the_whole_model(tmp_path: Path) -> None:
    """Under fsdp every rank holds half of each weight: the checkpoint is gathered on rank 0, named as the
    pipeline's own model names them (the checkpoint wrapper's `inner.` gone), and loads into it strictly.
    Validation is a collective there (each block all-gathers), so both ranks run it: no hang."""
    from autotune.pipelines.examples.language_model import LanguageModelPipeline

    cfg = TrialConfig(
        pipeline="tests.apply.train_pipelines:small_language_model",  # make_w64_d2's model, an epoch of 4 steps
        image_size=32,
        gpus=2,
        batch_size=32,
        parallel="fsdp",
        checkpoint_segments=1,
    )
    run = train.run_config(cfg, 1, tmp_path, "fsdp", say=lambda line: None)
    assert run["world"] == 2 and run["history"][0]["iou"] is not None  # the LM's metric: next-token accuracy
    weights = torch.load(run["checkpoint"], weights_only=True)["model"]
    model = LanguageModelPipeline(cfg, width=64, depth=2).build_model()
    model.load_state_dict(weights, strict=True)
    assert all(isinstance(v, torch.Tensor) and not hasattr(v, "device_mesh") for v in weights.values())
