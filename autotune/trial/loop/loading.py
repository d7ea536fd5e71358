"""The trial's DataLoader: the loader knobs (workers, pinning, prefetch, persistence, micro-batch) applied,
and the samplers that fix the data order whatever those knobs are (so they change speed only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Sampler

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.knobs import loader as loader_knobs
from autotune.core.effects import knob_effect


def sample_seed(data_seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one sample's draws in one epoch, from the data order's seed."""
    return ((data_seed * 1_000_003 + epoch) * 1_000_003 + index) % (2**63 - 1)


class EndlessShuffle(Sampler[Any]):
    """A fresh permutation of the dataset per epoch, forever, so that ONE loader iterator lasts a whole
    trial: no loader restart (worker start-up) at epoch boundaries, and batches simply span epochs.
    Under DDP each rank takes its own disjoint shard of each epoch's permutation, exactly what
    DistributedSampler(shuffle=True, seed, drop_last=True) gives after set_epoch(epoch)."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1, seeds: bool = False) -> None:
        if n < world or n == 0:  # an empty shard would make the iterator spin without ever yielding
            raise ConfigError(
                f"the dataset has {n} samples"
                + (f", fewer than the {world} ranks" if n else "")
                + "; generate more with `autotune make-data --n`"
            )
        self.n, self.seed, self.rank, self.world = n, seed, rank, world
        self.seeds = seeds  # yield (index, seed) for a dataset that takes them (harness.CheckedItems)

    def epoch(self, e: int) -> list[int]:
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + e)).tolist()
        usable = self.n - self.n % self.world  # the remainder is dropped so shards stay disjoint
        return perm[self.rank : usable : self.world]

    def __iter__(self) -> Iterator[Any]:
        """Indices; with seeds, (index, seed) pairs: the seed is the sample's own random stream for this
        epoch (harness.CheckedItems draws its augmentations from it), so a sample gets the same crop and
        flip whatever the number of loader workers or the micro-batch: those knobs change speed only."""
        e = 0
        while True:
            if self.seeds:
                yield from ((i, sample_seed(self.seed, e, i)) for i in self.epoch(e))
            else:
                yield from self.epoch(e)
            e += 1

    def __repr__(self) -> str:
        shard = f", rank {self.rank} of {self.world}" if self.world > 1 else ""
        return f"EndlessShuffle(seed={self.seed}{shard})"


class SeededEpochs(Sampler[Any]):
    """An epoch-sized sampler (`autotune train`'s) whose indices come with their per-sample seed, as
    EndlessShuffle's do: a config with loader workers trains on the same crops as the baseline without."""

    def __init__(self, inner: Sampler[int], data_seed: int) -> None:
        self.inner, self.data_seed, self.epoch = inner, data_seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((i, sample_seed(self.data_seed, self.epoch, i)) for i in self.inner)


def build_loader(
    dataset: Dataset[Any], cfg: TrialConfig, rank: int, world: int, device: torch.device, endless: bool = False
) -> tuple[DataLoader[Any], dict[str, Any]]:
    """endless=True (trials): one iterator for the whole trial. False (`autotune train`): epoch-sized."""
    n = len(dataset)  # type: ignore[arg-type]
    data_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
    sampler: Sampler[int]
    if endless:
        sampler = EndlessShuffle(n, data_seed, rank, world, seeds=getattr(dataset, "takes_seeds", False))
    elif n < world:
        raise ConfigError(
            f"the dataset has {n} samples, fewer than the {world} processes; "
            "generate more with `autotune make-data --n`"
        )
    else:  # training sees every sample each epoch: no partial batch dropped (DDP pads the last shard)
        sampler = (
            DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=data_seed)
            if world > 1
            # map-style datasets have __len__
            else RandomSampler(dataset, generator=torch.Generator().manual_seed(data_seed))  # type: ignore[arg-type]
        )
        if getattr(dataset, "takes_seeds", False):
            sampler = SeededEpochs(sampler, data_seed)
    kwargs = loader_knobs.arguments(cfg)
    kwargs["pin_memory"] = cfg.pin_memory and device.type == "cuda"
    # drop_last only for a measurement (endless: every batch is whole anyway); never for training.
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=endless, **kwargs)
    return loader, _applied(loader, cfg, world, endless)


def val_loader(dataset: Dataset[Any], cfg: TrialConfig) -> DataLoader[Any]:
    """`autotune train --validate`'s loader: every sample once, in order, with the trial's batch and workers."""
    return DataLoader(dataset, batch_size=cfg.batch_size, num_workers=cfg.num_workers)


def _applied(loader: DataLoader[Any], cfg: TrialConfig, world: int, endless: bool) -> dict[str, Any]:
    """What the loader put in effect, knob by knob, read back from the DataLoader itself."""
    return {
        "num_workers": knob_effect(cfg.num_workers, loader.num_workers),
        "pin_memory": knob_effect(
            cfg.pin_memory,
            loader.pin_memory,
            "" if loader.pin_memory or not cfg.pin_memory else "no CUDA device: nothing to pin for",
        ),
        "persistent_workers": knob_effect(
            cfg.persistent_workers,
            loader.persistent_workers,
            "one endless iterator: workers never restart, persistent or not"
            if endless and cfg.persistent_workers
            else "",
        ),
        "prefetch_factor": knob_effect(cfg.prefetch_factor, loader.prefetch_factor if cfg.num_workers else None),
        "batch_size": knob_effect(cfg.batch_size, loader.batch_size),
        "grad_accum": knob_effect(
            cfg.grad_accum,
            cfg.grad_accum,
            f"global batch {cfg.global_batch} = {cfg.batch_size} x {world} process(es) x {cfg.grad_accum}"
            if cfg.global_batch
            else "",
        ),
        "sampler": {
            "in_effect": repr(loader.sampler) if endless else type(loader.sampler).__name__,
            "why": "one loader iterator for the whole trial: epochs follow on without a loader restart"
            if endless
            else "epoch-sized: the loader is iterated once per epoch",
        },
    }
