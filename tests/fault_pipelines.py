"""Tiny pipelines that satisfy the Pipeline protocol, some of which fail on purpose.

Named as `tests.fault_pipelines:<factory>` in TrialConfig.pipeline. Each factory takes the
TrialConfig, like any pipeline factory. The model is a two-layer conv net on 16x16 random images,
so a trial spends its time in the runner, not in the model.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

HANG_S = 600.0  # longer than any test's trial timeout


class TinyPipeline:
    stages = ("0", "2")
    unsupported: frozenset[str] = frozenset()

    def __init__(self, cfg: Any, n: int = 32) -> None:
        self.cfg = cfg
        self.n = n

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 1))

    def build_dataset(self) -> Dataset[Any]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, 3, 16, 16, generator=g)
        y = (torch.rand(self.n, 1, 16, 16, generator=g) > 0.5).float()
        return TensorDataset(x, y)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(output.float(), target)


class OomPipeline(TinyPipeline):
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated by a test)")


class NanPipeline(TinyPipeline):
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().loss(output, target) * float("nan")


class HangInDatasetPipeline(TinyPipeline):
    def build_dataset(self) -> Dataset[Any]:
        time.sleep(HANG_S)
        return super().build_dataset()


class HangInLossPipeline(TinyPipeline):
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(HANG_S)  # by now the loader's workers (if any) are running
        return super().loss(output, target)


class SigkillPipeline(TinyPipeline):
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return super().loss(output, target)  # never reached


class SlowPipeline(TinyPipeline):
    """Healthy but ~0.1 s a step, so the launcher sees throughput windows while the trial runs."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)
        return super().loss(output, target)


class RefusesChannelsLast(TinyPipeline):
    unsupported = frozenset({"channels_last"})


class NotAPipeline:
    pass


def tiny(cfg: Any) -> TinyPipeline:
    return TinyPipeline(cfg)


def oom(cfg: Any) -> OomPipeline:
    return OomPipeline(cfg)


def nan(cfg: Any) -> NanPipeline:
    return NanPipeline(cfg)


def hang_dataset(cfg: Any) -> HangInDatasetPipeline:
    return HangInDatasetPipeline(cfg)


def hang_loss(cfg: Any) -> HangInLossPipeline:
    return HangInLossPipeline(cfg)


def sigkill(cfg: Any) -> SigkillPipeline:
    return SigkillPipeline(cfg)


def slow(cfg: Any) -> SlowPipeline:
    return SlowPipeline(cfg)


def no_channels_last(cfg: Any) -> RefusesChannelsLast:
    return RefusesChannelsLast(cfg)


def not_a_pipeline(cfg: Any) -> NotAPipeline:
    return NotAPipeline()


class BrokenPipeline(TinyPipeline):
    def build_model(self) -> nn.Module:
        raise RuntimeError("a bug in the user's model code")


def broken(cfg: Any) -> BrokenPipeline:
    return BrokenPipeline(cfg)


class WorkerReportingHang(TinyPipeline):
    """One good step, then a hang in the next loss, after writing this rank's pid and its loader
    workers' pids to $AUTOTUNE_TEST_PIDS.<pid>. The good step puts a window in progress.jsonl, so the
    launcher (and the test, through on_window) knows the trial is running."""

    calls = 0

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import json

        import psutil

        self.calls += 1
        report = os.environ.get("AUTOTUNE_TEST_PIDS")
        if self.calls >= 2 and report:
            me = psutil.Process()
            pids = {
                "rank": int(os.environ.get("RANK", 0)),
                "pid": me.pid,
                "children": [c.pid for c in me.children(recursive=True)],
            }
            with open(f"{report}.{me.pid}.tmp", "w") as f:
                json.dump(pids, f)
            os.replace(f"{report}.{me.pid}.tmp", f"{report}.{me.pid}")  # the test sees whole files only
        if self.calls >= 2:
            time.sleep(HANG_S)
        return super().loss(output, target)


def hang_loss_reporting(cfg: Any) -> WorkerReportingHang:
    return WorkerReportingHang(cfg)


class OomOnRankOne(TinyPipeline):
    """Rank 1 runs out of memory; rank 0 is left waiting in a collective, as in a real DDP OOM."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            raise torch.OutOfMemoryError("CUDA out of memory on rank 1 (simulated by a test)")
        return super().loss(output, target)


def oom_rank1(cfg: Any) -> OomOnRankOne:
    return OomOnRankOne(cfg)


class RealOomOnRankOne(TinyPipeline):
    """Rank 1 asks its device for 4 TiB, a real allocation failure (torch.OutOfMemoryError on CUDA), not a
    raised one; rank 0 is left waiting in a collective. For scripts/gpu_check.sh: only ever run on a GPU."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            torch.empty(1 << 42, dtype=torch.uint8, device=output.device)
        return super().loss(output, target)


def oom_rank1_real(cfg: Any) -> RealOomOnRankOne:
    return RealOomOnRankOne(cfg)


class FaultByBatchSize(TinyPipeline):
    """One pipeline whose fault is chosen by the config, so one search meets every kind of failure:
    batch 2 healthy, 3 out of memory, 5 NaN loss, 6 SIGKILL, 7 hang, 8 a killed DataLoader worker;
    channels_last is declared unsupported."""

    unsupported = frozenset({"channels_last"})

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, n=64)
        self.fault = cfg.batch_size

    def build_dataset(self) -> Dataset[Any]:
        data = super().build_dataset()
        return _KillsItsWorker(data) if self.cfg.batch_size == 8 else data

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)  # a few windows per second, so the launcher sees progress
        if self.fault == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated by a test)")
        if self.fault == 6:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == 7:
            time.sleep(HANG_S)
        loss = super().loss(output, target)
        return loss * float("nan") if self.fault == 5 else loss


class _KillsItsWorker(Dataset[Any]):
    def __init__(self, inner: Dataset[Any]) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None and i % 7 == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # the loader worker dies mid-epoch
        return self.inner[i]


def fault_by_batch_size(cfg: Any) -> FaultByBatchSize:
    return FaultByBatchSize(cfg)


class ShardLoss(TinyPipeline):
    """The loss is the mean of the batch's sample indices (the target is the index): 8 samples, 4 a rank
    on 2 ranks, so every step's global batch is one whole epoch, mean 3.5, while each rank's own shard
    has another mean. The model's output enters with weight 0 so DDP still has gradients to reduce."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, n=8)

    def build_dataset(self) -> Dataset[Any]:
        x = torch.zeros(self.n, 3, 16, 16)
        y = torch.arange(self.n, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, 16, 16).contiguous()
        return TensorDataset(x, y)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return target.float().mean() + 0 * output.float().mean()


def shard_loss(cfg: Any) -> ShardLoss:
    return ShardLoss(cfg)


class NanOnRankOne(TinyPipeline):
    """Rank 1's loss becomes NaN at its first step; rank 0 is left waiting in the gradient all-reduce."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = super().loss(output, target)
        return loss * float("nan") if os.environ.get("RANK") == "1" else loss


def nan_rank1(cfg: Any) -> NanOnRankOne:
    return NanOnRankOne(cfg)


# ProcessGroupNCCL's own LOG(ERROR) line (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), as a rank prints it.
WATCHDOG_LINE = (
    "[rank1]:[E1201 01:02:03.456789012 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
    "ran for 600042 milliseconds before timing out."
)


class WatchdogAbort(TinyPipeline):
    """What NCCL's watchdog does to a rank whose collective timed out: logs why, then std::terminate ->
    abort() from its own C++ thread, so nothing in Python runs and no verdict is written."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import sys

        print(WATCHDOG_LINE, file=sys.stderr, flush=True)
        print("terminate called after throwing an instance of 'c10::DistBackendError'", file=sys.stderr, flush=True)
        os.abort()


def watchdog_abort(cfg: Any) -> WatchdogAbort:
    return WatchdogAbort(cfg)


class NoBlocks(TinyPipeline):
    """Neither stages nor blocks: nothing for parallel=fsdp to shard one by one."""

    stages = ()


def no_blocks(cfg: Any) -> NoBlocks:
    return NoBlocks(cfg)
