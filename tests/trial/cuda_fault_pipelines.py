"""Pipelines that fail the way a GPU trial does, on CPU: each raises the exact exception (type and
message) that torch, cuBLAS, cuDNN, NCCL or the DataLoader's pin-memory thread raise when memory runs
out, so the real worker process must classify it.

Named as `tests.trial.cuda_fault_pipelines:<factory>` in TrialConfig.pipeline.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import torch
from torch.utils.data import Dataset

from tests.fault_pipelines import HANG_S, TinyPipeline

# What TORCH_CUDABLAS_CHECK (ATen/cuda/Exceptions.h) raises when cublasCreate cannot allocate.
CUBLAS = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
# AT_CUDNN_CHECK: "cuDNN error: " + cudnnGetErrorString(status). cuDNN 8 named it ALLOC_FAILED; cuDNN 9
# (what torch 2.x ships) calls the device-side one CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED.
CUDNN8 = "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"
CUDNN9 = "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"
# C10D_NCCL_CHECK (c10d/NCCLUtils.hpp): "NCCL error in: <file>:<line>, <ncclGetErrorWithVersion>\n<detail>".
NCCL = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\nncclUnhandledCudaError: Call to CUDA "
    "function failed.\nLast error:\nCuda failure 2 'out of memory'"
)
# C10_CUDA_CHECK(cudaHostAlloc(...)) in the caching host allocator: cudaErrorMemoryAllocation.
HOST_ALLOC = (
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API "
    "call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def pin_thread_error() -> BaseException:
    """The exception the DataLoader raises in the trainer when pinning a batch failed: built by the
    same torch code (_utils.ExceptionWrapper, as _pin_memory_loop wraps it and the loader iterator
    re-raises it), from the AcceleratorError that cudaHostAlloc's failure raises."""
    from torch._utils import ExceptionWrapper

    try:
        raise torch.AcceleratorError(HOST_ALLOC)
    except torch.AcceleratorError:
        wrapped = ExceptionWrapper(sys.exc_info(), where="in pin memory thread for device 0")
    try:
        wrapped.reraise()
    except Exception as e:
        return e
    raise AssertionError("reraise() returned")


def make_error(kind: str) -> BaseException:
    import torch.distributed as dist

    return {
        "cublas": lambda: RuntimeError(CUBLAS),
        "cudnn8": lambda: RuntimeError(CUDNN8),
        "cudnn9": lambda: RuntimeError(CUDNN9),
        "nccl": lambda: dist.DistBackendError(NCCL),
        "pin": pin_thread_error,
        # Not out of memory, though it says "memory": a bug, which must stay a crash.
        "illegal": lambda: torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    }[kind]()


class RaisesAtFirstStep(TinyPipeline):
    kind = "cublas"

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise make_error(self.kind)


def _raising(kind: str) -> Any:
    def factory(cfg: Any) -> RaisesAtFirstStep:
        p = RaisesAtFirstStep(cfg)
        p.kind = kind
        return p

    return factory


cublas, cudnn8, cudnn9, nccl, pin, illegal = (
    _raising(k) for k in ("cublas", "cudnn8", "cudnn9", "nccl", "pin", "illegal")
)


class CublasOomOnRankOne(TinyPipeline):
    """Rank 1 cannot create its cuBLAS handle at its first step; rank 0 goes on into DDP's all-reduce.
    Rank 1 also leaves a non-daemon thread behind, as a stand-in for what can block a normal interpreter
    exit after a GPU failure (NCCL's process-group teardown waiting on its watchdog): the rank must
    not wait for it, or rank 0 hangs in the collective until the trial's timeout."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            threading.Thread(target=time.sleep, args=(HANG_S,), daemon=False).start()
            raise RuntimeError(CUBLAS)
        return super().loss(output, target)


def cublas_rank1(cfg: Any) -> CublasOomOnRankOne:
    return CublasOomOnRankOne(cfg)


class SlowWarmup(TinyPipeline):
    """The first `warmup_steps` steps take WARMUP_SLEEP_S longer, as torch.compile's compiling steps do."""

    WARMUP_SLEEP_S = 0.4

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.calls = 0

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= self.cfg.warmup_steps:
            time.sleep(self.WARMUP_SLEEP_S)
        return super().loss(output, target)


def slow_warmup(cfg: Any) -> SlowWarmup:
    return SlowWarmup(cfg)


class FewItems(TinyPipeline):
    """Six items: smaller than a batch of 8, which a trial must still run (its batches span epochs)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, n=6)


def few_items(cfg: Any) -> FewItems:
    return FewItems(cfg)


class WorkerPid(Dataset[tuple[int, int]]):
    """Item i is (i, pid of the DataLoader worker that loaded it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        assert torch.utils.data.get_worker_info() is not None, "loaded in the main process: the test needs a worker"
        return i, os.getpid()
