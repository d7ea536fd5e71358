"""A pipeline with every knob applied: the one training step that trials and `autotune train` share."""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, refuse_unsupported
from autotune.core.errors import DataItemError
from autotune.pipelines import Pipeline, blocks_of, stages_of, unsupported_of
from autotune.trial.loop import knobs, loading, sharding, warm_model
from autotune.trial.loop.knobs import optimizer_fusion, set_to_none
from autotune.trial.measurement.clock import NonFiniteLoss


# Not the data's fault: running out of memory is the config's (batch size, workers), and reported as such.
_PASS_THROUGH = (DataItemError, MemoryError, torch.OutOfMemoryError)

# Exact strings that name a failed allocation, each from its library's own status names, so that
# "memory" in some other error (an illegal memory access: a bug) is never taken for one.
_OOM_MARKERS = (
    "CUDA error: out of memory",  # cudaErrorMemoryAllocation outside the caching allocator: cudaHostAlloc
    # for a pinned batch (in the DataLoader's pin-memory thread), a library's own cudaMalloc
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not allocate its handle or workspace
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN 8; a deprecated alias in cuDNN 9 for the two below
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    # Not CUDNN_STATUS_NOT_ENOUGH_WORKSPACE: a plan given less workspace than it asked for is a sizing
    # bug, not memory running out (torch allocates cuDNN workspaces from its caching allocator, so a
    # real shortage there is already a torch.OutOfMemoryError).
)


def is_out_of_memory(e: BaseException) -> bool:
    """Out of device (or pinned host) memory, however the library that ran out says so."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    if not isinstance(e, RuntimeError):
        return False
    text = str(e)
    if any(m in text for m in _OOM_MARKERS):
        return True
    # NCCL reports a failed allocation as e.g. "Cuda failure 2 'out of memory'" or "Failed to CUDA
    # calloc ... out of memory", raised as DistBackendError: "out of memory", in NCCL's errors only.
    dist = getattr(torch, "distributed", None)
    backend_error = getattr(dist, "DistBackendError", ()) if dist is not None and dist.is_available() else ()
    return isinstance(e, backend_error) and "out of memory" in text.lower()


def oom_message(e: BaseException) -> str:
    """One line: the one that names the failed allocation (a re-raised error starts with "Caught ... in
    pin memory thread", its cause further down), with the first line beside it when they differ."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if not lines:
        return "out of memory"
    hit = next(
        (line for line in lines if any(m in line for m in _OOM_MARKERS) or "out of memory" in line.lower()), lines[0]
    )
    return hit if hit == lines[0] else f"{hit} ({lines[0]})"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Draw an item's augmentations from its own seed (torch, numpy and random), leaving the process's
    generators as they were, so that what the model draws (dropout) does not depend on the loader.

    Only the CPU generator, which a dataset draws from: torch.manual_seed would reseed every CUDA device
    too, which fork_rng(devices=[]) neither saves nor restores. With num_workers=0 the items load in the
    training process, so each sample would reset the GPU's dropout stream, and the masks would depend on
    the num_workers knob."""
    if seed is None:
        yield
        return
    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


class CheckedItems(Dataset[Any]):
    """The pipeline's dataset with an item that fails to load reported as the data's fault (a
    DataItemError naming its index, the cause chained for the log) instead of a crash. A top-level
    class so DataLoader workers can receive it pickled under any start method."""

    takes_seeds = True  # the endless sampler hands it (index, seed): see loading.EndlessShuffle

    def __init__(self, inner: Dataset[Any]) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        index, seed = key if isinstance(key, tuple) else (key, None)
        try:
            with seeded(seed):
                return self.inner[index]
        except _PASS_THROUGH:
            raise
        except Exception as e:
            if is_out_of_memory(e):
                raise
            raise DataItemError(f"dataset item {index}: {_first_line(e)}", index=index) from e


class CheckedBatches(CheckedItems):
    """For a dataset that fetches a batch at once (__getitems__, as Subset and HF datasets do): the
    DataLoader calls that instead of __getitem__, and a wrapper without it would change what is measured."""

    def __getitems__(self, keys: list[Any]) -> Any:
        pairs = [k if isinstance(k, tuple) else (k, None) for k in keys]
        indices = [i for i, _ in pairs]
        try:
            with seeded(pairs[0][1] if pairs else None):  # one batch, one stream: its first sample's
                return self.inner.__getitems__(indices)  # type: ignore[attr-defined]
        except _PASS_THROUGH:
            raise
        except Exception as e:
            if is_out_of_memory(e):
                raise
            shown = ", ".join(map(str, indices[:5])) + (", ..." if len(indices) > 5 else "")
            raise DataItemError(f"dataset items {shown} (one batch): {_first_line(e)}") from e


def checked(dataset: Dataset[Any]) -> Dataset[Any]:
    if isinstance(dataset, IterableDataset):  # no items to name; build_loader refuses it anyway
        return dataset
    return CheckedBatches(dataset) if callable(getattr(dataset, "__getitems__", None)) else CheckedItems(dataset)


@dataclass
class Harness:
    cfg: TrialConfig
    device: torch.device
    rank: int
    world: int
    pipeline: Pipeline
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader[Any]
    precision: knobs.Precision
    applied: dict[str, Any]

    def step(self, micro_batches: list[Any]) -> float:
        """One optimizer step over `micro_batches` (cfg.grad_accum of them, fewer at the end of a train
        epoch); returns the step's loss, the micro-batches' mean. Raises NonFiniteLoss on nan/inf."""
        n = len(micro_batches)
        total = torch.zeros((), device=self.device)
        for i, batch in enumerate(micro_batches):
            x, y = (knobs.to_device(t, self.device, self.cfg) for t in batch)
            # Under DDP or FSDP every micro-step but the last skips the gradient reduction: one per optimizer step.
            with sharding.no_sync(self.model, last=i == n - 1):
                with self.precision.autocast():
                    loss = self.pipeline.loss(self.model(x), y)
                self.precision.scaler.scale(loss / n).backward()  # mean over micro-batches: the full batch's
            total += loss.detach().float()
        self.precision.scaler.step(self.optimizer)
        self.precision.scaler.update()
        set_to_none.zero_grad(self.optimizer, self.cfg)  # apex's zero_grad() takes no set_to_none
        value = (total / n).item()  # a device sync too: the step is finished when this returns
        if not math.isfinite(value):
            raise NonFiniteLoss(f"loss became {value}")
        return value

    def batches(self) -> Iterator[list[Any]]:
        """Endless optimizer steps' worth of micro-batches (lists of cfg.grad_accum)."""
        return grouped(batches(self.loader), self.cfg.grad_accum)


def grouped(stream: Iterator[Any], k: int) -> Iterator[list[Any]]:
    """Consecutive lists of k items; a last, shorter list when `stream` ends (a train epoch)."""
    group: list[Any] = []
    for item in stream:
        group.append(item)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Endless batches. An endless sampler: one iterator, never restarted. An epoch-sized loader (train's):
    a short dataset simply starts another epoch (reshuffled), restarting the loader."""
    if isinstance(loader.sampler, loading.EndlessShuffle):
        yield from loader
        return
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def build(cfg: TrialConfig, *, endless: bool = False) -> Harness:
    """Process setup, pipeline, and every knob, in the order they must be applied.

    endless=True (a trial): the loader's sampler never ends, so one iterator serves the whole trial
    and a batch may be larger than the dataset. False (`autotune train`): an epoch-sized, finite loader."""
    import torch.distributed as dist

    rank, world, local_rank = knobs.dist_env()
    device = knobs.pick_device(local_rank)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(knobs.ddp_backend(device))
    applied: dict[str, Any] = knobs.setup_process(cfg, device)
    pipeline = warm_model.seeded_pipeline(cfg, rank)
    refuse_unsupported(cfg, unsupported_of(pipeline))
    model = warm_model.build_model(pipeline, cfg)  # pipeline.build_model(), or a warm server's copy of it
    # Batch-norm statistics span one micro-batch on one process: a smaller micro-batch changes them.
    applied["batch_norm_layers"] = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    applied |= knobs.on_stages(model, stages_of(pipeline), cfg)
    if sharding.wanted(cfg, world):
        model, a = sharding.shard(model, cfg, device, world, blocks_of(pipeline))
    else:
        model, a = knobs.prepare_model(model, cfg, device, world)
        a |= sharding.inert_effects(cfg, world)
    applied |= a
    model.train()
    optimizer, a = optimizer_fusion.build_optimizer(model.parameters(), cfg, device)
    applied |= a
    loader, a = loading.build_loader(checked(pipeline.build_dataset()), cfg, rank, world, device, endless)
    applied |= a
    precision = knobs.Precision(cfg, device)
    applied |= precision.applied
    applied["set_to_none"] = knob_effect(cfg.set_to_none, cfg.set_to_none)
    return Harness(cfg, device, rank, world, pipeline, model, optimizer, loader, precision, applied)
