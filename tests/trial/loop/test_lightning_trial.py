"""autotune/trial/loop/frameworks/lightning.py: the trial's clock drains what the rebuilt loader made ahead, and
the Trainer a Lightning trial builds for ranks that share a GPU (AUTOTUNE_DDP_BACKEND=gloo), built for real
under a faked CUDA and torchrun's environment."""

from __future__ import annotations

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.pipelines.frameworks.lightning import trainer_kwargs
from autotune.trial.loop import knobs, worker
from autotune.trial.loop.frameworks import lightning as trial_lightning

pl = pytest.importorskip("lightning.pytorch")

CFG = TrialConfig(pipeline="lightning:tests.pipelines.lightning_jobs:make", gpus=2)


@pytest.mark.parametrize(
    "changes, drained",
    [
        (dict(num_workers=2, prefetch_factor=2), 4),  # the 2 workers x prefetch 2 batches made ahead
        (dict(num_workers=2, prefetch_factor=2, batch_size=16, global_batch=32), 2),  # 2 batches a step
        (dict(num_workers=2, prefetch_factor=2, warmup_steps=0), 0),  # parity's runs: exactly their steps
    ],
)
def test_the_batches_the_loader_made_ahead_are_drained_before_the_clock_starts(
    repo_on_path: object, capsys: pytest.CaptureFixture[str], changes: dict[str, int], drained: int
) -> None:
    """As autotune's own loop does: timed, the batches the workers made while the first steps were slow
    would come free and overstate a many-worker config. The Trainer runs as many more steps."""
    cfg = CFG.replace(gpus=1, warmup_steps=1, timed_steps=2, window=1, num_threads=1).replace(**changes)
    r = worker.run(cfg)
    assert r.timed_steps == 2 and len(r.losses) == cfg.warmup_steps + drained + 2
    said = f"{drained} more warm-up step(s): the loader keeps 4 batches made ahead (2 workers x prefetch 2)"
    assert (said in capsys.readouterr().err) == bool(drained)


@pytest.fixture
def rank_1_of_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of a 2-rank torchrun on this machine, as the Lightning environment reads it."""
    env = {"TORCHELASTIC_RUN_ID": "test", "RANK": "1", "LOCAL_RANK": "1", "GROUP_RANK": "0"}
    env |= {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


def trainer(cfg: TrialConfig, device: torch.device) -> pl.Trainer:
    """The Trainer as the trial builds it (its devices and strategy), without fitting: no CUDA here."""
    kwargs = trainer_kwargs(cfg, device.type == "cuda") | trial_lightning.placement(cfg, device)
    return pl.Trainer(**kwargs, logger=False, enable_checkpointing=False, enable_progress_bar=False)


@pytest.mark.usefixtures("rank_1_of_2")
def test_two_ranks_on_one_gpu_over_gloo_both_run_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=1)
    monkeypatch.setenv(knobs.DDP_BACKEND_ENV, "gloo")
    device = knobs.pick_device(local_rank=1)  # the trial's own choice for rank 1: GPU 1 mod 1
    assert device == torch.device("cuda", 0)
    t = trainer(CFG, device)
    assert t.strategy.root_device == torch.device("cuda", 0)  # rank 1 on the one GPU there is
    assert t.strategy.parallel_devices == [torch.device("cuda", 0)] * 2
    assert t.strategy.process_group_backend == "gloo"  # nccl refuses two ranks on one GPU
    assert (t.world_size, t.global_rank, t.num_devices) == (2, 1, 2)
    why = trial_lightning.gpus_why(CFG, t, cuda=True)
    assert "parallel_devices=[cuda:0, cuda:0]" in why and "process_group_backend='gloo'" in why
    assert "2 ranks over gloo on 1 GPU" in why


@pytest.mark.usefixtures("rank_1_of_2")
def test_the_exported_devices_2_would_put_rank_1_on_a_gpu_that_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the trial cannot pass trainer_kwargs as they are: under torchrun Lightning skips its check of the
    visible GPUs, and rank 1 of devices=2 gets cuda:1 (its set_device then fails), over nccl."""
    fake_cuda(monkeypatch, count=1)
    t = pl.Trainer(**trainer_kwargs(CFG, cuda=True), logger=False, enable_checkpointing=False)
    assert t.strategy.root_device == torch.device("cuda", 1)
    assert t.strategy.process_group_backend is None  # Lightning's default for CUDA at setup: nccl


@pytest.mark.usefixtures("rank_1_of_2")
def test_gloo_with_a_gpu_per_rank_keeps_one_gpu_each(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv(knobs.DDP_BACKEND_ENV, "gloo")
    t = trainer(CFG, torch.device("cuda", 1))
    assert t.strategy.parallel_devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert t.strategy.root_device == torch.device("cuda", 1) and t.strategy.process_group_backend == "gloo"


def test_without_shared_gpus_the_trainer_keeps_the_exported_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(knobs.DDP_BACKEND_ENV, raising=False)
    assert trial_lightning.placement(CFG, torch.device("cuda", 0)) == {}  # nccl, one rank per GPU: devices=2
    monkeypatch.setenv(knobs.DDP_BACKEND_ENV, "gloo")
    assert trial_lightning.placement(CFG, torch.device("cpu")) == {}  # CPU ranks: Lightning's gloo already
    assert trial_lightning.placement(CFG.replace(gpus=1), torch.device("cuda", 0)) == {}


@pytest.mark.parametrize("precision, dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_the_trial_observes_what_the_trainer_computed_in_and_where(
    repo_on_path: object, precision: str, dtype: str
) -> None:
    """applied.observed (scripts/gpu_check.sh's lightning row asserts it on a GPU): the dtype the module's first
    Linear returned under the Trainer's precision, the module's parameters' device, the optimizer's step."""
    cfg = CFG.replace(gpus=1, precision=precision, warmup_steps=1, timed_steps=2, window=1, num_threads=1)
    seen = worker.run(cfg).applied["observed"]
    assert seen["output_dtype"] == dtype and seen["output_of"] == "net.0 (Linear)"
    assert seen["param_device"] == "cpu" and seen["optimizer"] == "torch.optim.adamw.AdamW"
    assert seen["optimizer_step_device"] == "cpu" and seen["process_group_size"] == 1
