"""parallel=fsdp: real 2-rank FSDP2 trials over gloo on the sized language model and on a conv net, every knob
read back from the result's `applied` (what FSDP really did on the first step), parity with DDP at fp32, and
bad input."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import harness, sharding
from autotune.trial.processes import launcher

pytestmark = pytest.mark.side_by_side

LM = "autotune.pipelines.examples.language_model:make_w64_d2"
CONV = "tests.fault_pipelines:tiny"  # two convolutions (3x3, then 1x1) on 16x16 images
# 2 ranks x micro-batch 4 x accumulation 2: global batch 16.
BASE = TrialConfig(
    pipeline=LM, image_size=32, gpus=2, batch_size=4, global_batch=16, warmup_steps=1, timed_steps=3, window=1
)
TIMEOUT_S = 240


def run(tmp_path: Path, **changes: Any) -> Any:
    return launcher.run_trial(BASE.replace(**changes), tmp_path / "trial", timeout_s=TIMEOUT_S)


@pytest.mark.slow
def test_fsdp_keeps_params_after_forward_reduces_in_bf16_and_offloads(tmp_path: Path) -> None:
    r = run(tmp_path, parallel="fsdp", fsdp_reshard=False, fsdp_reduce_dtype="bf16", fsdp_offload=True)
    a = r.applied
    assert r.status == "ok" and r.world_size == 2
    assert a["parallel"]["in_effect"] == "fully_shard on 2 block(s) then the root"
    seen = a["fsdp"]
    # Every parameter is a DTensor holding half of it on each of the 2 ranks (dim 0 of each is even).
    assert seen["dtensor_params"] == seen["params"] > 0 and seen["local_numel"] * 2 == seen["numel"]
    assert a["fsdp_reshard"]["in_effect"] is False and seen["resharded_after_forward"] is False
    assert a["fsdp_reduce_dtype"]["in_effect"] == "bfloat16" and a["fsdp_param_dtype"]["in_effect"] == "float32"
    assert seen["block_output_dtype"] == "float32"
    assert a["fsdp_offload"] == {
        "requested": True,
        "in_effect": True,
        "why": "no CUDA device: the parameters already live in host memory",
    }
    assert seen["shard_device"] == "cpu"
    # 4 optimizer steps (1 warm-up + 3 timed) of 2 micro-steps: sync off on the first of each, on on the last.
    assert (seen["sync_off_micro_steps"], seen["sync_on_micro_steps"]) == (4, 4)
    assert a["grad_accum"]["in_effect"] == 2


@pytest.mark.slow
def test_fsdp_reshards_after_forward_and_computes_in_bf16_params(tmp_path: Path) -> None:
    r = run(tmp_path, parallel="fsdp", fsdp_param_dtype="bf16", global_batch=None)
    seen = r.applied["fsdp"]
    assert r.status == "ok"
    assert r.applied["fsdp_reshard"]["in_effect"] is True and seen["resharded_after_forward"] is True
    assert r.applied["fsdp_param_dtype"]["in_effect"] == "bfloat16" and seen["block_output_dtype"] == "bfloat16"
    assert r.applied["fsdp_offload"]["in_effect"] is False
    assert (seen["sync_off_micro_steps"], seen["sync_on_micro_steps"]) == (0, 4)  # no accumulation


@pytest.mark.slow
def test_fsdp_trains_the_same_losses_as_ddp_at_fp32(tmp_path: Path) -> None:
    """Same seed, same data, fp32 everywhere: sharding changes where the step is computed, not what."""
    ddp = launcher.run_trial(BASE, tmp_path / "ddp", timeout_s=TIMEOUT_S)
    fsdp = launcher.run_trial(BASE.replace(parallel="fsdp"), tmp_path / "fsdp", timeout_s=TIMEOUT_S)
    assert ddp.applied["parallel"]["in_effect"] == "ddp" and ddp.applied["fsdp_reshard"]["in_effect"] is None
    assert len(ddp.losses) == len(fsdp.losses) == 4
    assert ddp.losses[0] != ddp.losses[-1]  # the model trained: the comparison means something
    assert fsdp.losses == pytest.approx(ddp.losses, rel=1e-4)


@pytest.mark.slow
def test_fsdp_with_channels_last_trains_a_conv_net_with_channels_last_activations(
    tmp_path: Path, repo_on_path: Path
) -> None:
    """channels_last converted the weights, which fully_shard refuses for any conv wider than 1x1; now the
    weights stay as they are and the inputs carry the layout through the convolutions."""
    cfg = TrialConfig(pipeline=CONV, gpus=2, batch_size=2, parallel="fsdp", channels_last=True)
    cfg = cfg.replace(warmup_steps=1, timed_steps=2, window=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=TIMEOUT_S)
    assert r.status == "ok", r.message
    seen = r.applied["fsdp"]
    assert seen["dtensor_params"] == seen["params"] > 0  # every conv weight sharded, the 3x3 one included
    assert seen["block_output_channels_last"] is True  # the first conv's output: NHWC from an NHWC input
    assert r.applied["channels_last"]["in_effect"] is True
    assert r.applied["channels_last"]["why"].startswith("activations only")
    assert len(r.losses) == 3 and all(math.isfinite(x) for x in r.losses)


# --- without processes ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.7.1+cu126", "2.3.0"])
def test_fsdp_on_a_torch_without_reshard_after_forward_none_is_unsupported(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """Exit 5 naming the torch it needs, before any process group or collective (there is none here)."""
    monkeypatch.setattr(torch, "__version__", version)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    needs = rf"parallel=fsdp needs torch >= 2\.8 .*this is torch {re.escape(version)}"
    with pytest.raises(TrialUnsupported, match=needs):
        sharding.shard(model, TrialConfig(parallel="fsdp", gpus=2), torch.device("cpu"), 2, ("0", "1"))


@pytest.mark.parametrize("version", ["2.8.0", "2.8.0a0+5228986c39.nv25.05", "2.10.1+cu130", "3.0.0"])
def test_torch_2_8_and_later_may_shard(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr(torch, "__version__", version)  # "2.10" sorts before "2.8" as text, not as a release
    assert sharding.torch_too_old() == ""


def test_one_process_records_the_strategy_as_not_in_effect() -> None:
    out = sharding.inert_effects(TrialConfig(parallel="fsdp", fsdp_offload=True), world=1)
    assert out["parallel"] == {
        "requested": "fsdp",
        "in_effect": "none",
        "why": "one process: nothing to replicate or shard",
    }
    assert out["fsdp_offload"]["in_effect"] is None
    assert not sharding.wanted(TrialConfig(parallel="fsdp"), world=1)
    assert sharding.wanted(TrialConfig(parallel="fsdp", gpus=2), world=2)
    assert not sharding.wanted(TrialConfig(gpus=2), world=2)


def test_blocks_are_sharded_deepest_first_and_must_exist() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2))
    assert sharding.blocks_in_order(model, ["0", "0.1", "1"]) == ["0.1", "0", "1"]
    with pytest.raises(TrialUnsupported, match="lacks: 7"):
        sharding.blocks_in_order(model, ["0", "7"])


def test_fsdp_without_blocks_is_refused_before_any_process_group() -> None:
    with pytest.raises(TrialUnsupported, match="neither `stages` nor `blocks`"):
        sharding.shard(nn.Linear(2, 2), TrialConfig(parallel="fsdp", gpus=2), torch.device("cpu"), 2, ())


def test_a_hand_written_fsdp_config_on_a_pipeline_without_blocks_is_unsupported() -> None:
    """Exit 5 (TrialUnsupported), naming why: FSDP shards per block, and this pipeline names none."""
    cfg = TrialConfig(pipeline="tests.fault_pipelines:no_blocks", parallel="fsdp", gpus=2)
    with pytest.raises(TrialUnsupported, match=r"parallel \(fsdp shards per block.*neither `stages` nor `blocks`\)"):
        harness.build(cfg)
