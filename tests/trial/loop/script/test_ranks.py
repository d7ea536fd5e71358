"""trial/loop/script/ranks.py: gpus for a script that sets up no process group. Under torchrun (2 gloo ranks on
this CPU) the trial sets the group up, replicates the model the optimizer trains and shards its training
DataLoader; each rank trains on its own samples with the same gradients, the global batch is both ranks'
samples, and the script's checkpoint is written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.pipelines import base_config, script
from autotune.trial.processes import launcher

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.slow, pytest.mark.side_by_side]
SCRIPTS = Path(__file__).parent / "scripts"


def test_an_unedited_script_runs_data_parallel_on_two_ranks(tmp_path: Path) -> None:
    record, checkpoint = tmp_path / "record", tmp_path / "checkpoint.pt"
    record.mkdir()
    args = ["--save", str(checkpoint), "--record", str(record)]
    job = script.load(TrialConfig(pipeline=script.spec_of(str(SCRIPTS / "unedited" / "train.py"), args)))
    assert "gpus" not in job.unsupported and "parallel" in job.unsupported  # DDP with no edit; FSDP not
    cfg = TrialConfig(pipeline=job.spec, gpus=2, batch_size=16, warmup_steps=1, timed_steps=3, window=1, num_threads=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    a, seen = r.applied, r.applied["observed"]
    assert seen["world_size"] == seen["process_group_size"] == 2 and seen["process_group_backend"] == "gloo"
    assert a["gpus"]["in_effect"] == 2 and "replicated Net in place" in a["gpus"]["why"]
    assert "sharded 1 training DataLoader(s) with a DistributedSampler" in a["gpus"]["why"]
    assert seen["model_replicated"] is True and seen["sharded_loaders"] == 1
    assert seen["param_device"] == "cpu"  # the model found (no at.model()), its parameters where they live
    # 16 samples a step on each rank: the global batch is 32, recorded as planned.
    assert seen["samples_per_step_per_rank"] == 16 and seen["global_batch"] == 32
    assert a["global_batch"]["requested"] == a["global_batch"]["in_effect"] == 32
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Each rank's loader is its shard: the sample indices of the first pass are disjoint, half each.
    first, second = set(ranks[0]["indices"]), set(ranks[1]["indices"])
    assert first and second and not first & second and len(first) == len(second)
    # DDP averaged the gradients: after the first step they are equal on both ranks.
    assert ranks[0]["grads"].keys() == ranks[1]["grads"].keys()
    assert ranks[0]["grads"] == pytest.approx(ranks[1]["grads"], rel=1e-6, abs=1e-9)
    # The checkpoint is written once, by rank 0 (rank 1's torch.save skipped), with the model's own names.
    assert seen["ranks"]["torch_save"] == {"written": [1, 0], "skipped": [0, 1]}
    assert set(torch.load(checkpoint)) == set(ranks[0]["grads"])
    # Rank 1 printed nothing: the trial log has rank 0's step lines only.
    log = (tmp_path / "trial" / "trial.log").read_text()
    assert log.count("step 0 loss") == 1, log[-2000:]


def test_a_study_s_global_batch_is_divided_over_the_ranks(tmp_path: Path) -> None:
    """--global-batch 8, the script's own batch: on 2 ranks each loader delivers 4, so the 2 GPUs train the
    script's own math (the global batch and the lr as it wrote them), though it calls no at.accumulation()."""
    spec = script.spec_of(str(SCRIPTS / "unedited" / "train.py"))
    base = base_config(spec, None, None, str(tmp_path), global_batch=8, batch_size=8)
    assert base.keeps_accumulation and base.lr == pytest.approx(1e-3)
    cfg = base.replace(gpus=2, batch_size=4, warmup_steps=1, timed_steps=3, window=1, num_threads=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    a, seen = r.applied, r.applied["observed"]
    assert seen["samples_per_step_per_rank"] == 4 and seen["global_batch"] == 8
    assert a["global_batch"]["requested"] == a["global_batch"]["in_effect"] == 8
    assert a["batch_size"]["in_effect"] == 4 and a["lr"]["in_effect"] == pytest.approx(1e-3)


def test_an_lr_the_script_scales_with_its_per_rank_batch_is_set_for_the_global_batch(tmp_path: Path) -> None:
    """lr = 1e-3 * args.batch_size / 8 on 2 ranks of 16: the script's arithmetic sees its per-rank 16 (2e-3); the
    2 ranks train 32 a step, so its own linear rule asks 4e-3, and the trial puts the missing x2 on it."""
    path = tmp_path / "train.py"
    source = (SCRIPTS / "unedited" / "train.py").read_text()
    path.write_text(
        source.replace("model.parameters(), lr=1e-3)", "model.parameters(), lr=1e-3 * args.batch_size / 8)")
    )
    base = base_config(script.spec_of(str(path)), None, None, str(tmp_path))
    cfg = base.replace(gpus=2, batch_size=16, warmup_steps=1, timed_steps=3, window=1, num_threads=1)
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    assert r.applied["global_batch"]["in_effect"] == 32
    assert r.applied["lr"]["in_effect"] == pytest.approx(4e-3), r.applied["lr"]


def test_a_training_loader_with_its_own_sampler_cannot_be_sharded(tmp_path: Path) -> None:
    """Every rank would train on the same batches: the trial stops with why (exit 5), never trains them."""
    path = tmp_path / "train.py"
    source = (SCRIPTS / "unedited" / "train.py").read_text()
    sampled = source.replace(
        "shuffle=True, drop_last=True)", "sampler=torch.utils.data.RandomSampler(data), drop_last=True)"
    )
    assert sampled != source
    path.write_text(sampled)
    cfg = TrialConfig(
        pipeline=script.spec_of(str(path)), gpus=2, batch_size=8, warmup_steps=1, timed_steps=2, num_threads=1
    )
    with pytest.raises(TrialUnsupported, match="every rank would train on the same batches .*a sampler of its own"):
        launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
