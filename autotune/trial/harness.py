"""A pipeline with every knob applied: the one training step that trials and `autotune train` share."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from autotune.trial import knobs
from autotune.core.config import KNOBS, TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.pipelines import Pipeline, load_pipeline, stages_of, unsupported_of


class NonFiniteLoss(Exception):
    pass


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

    def step(self, batch: Any) -> float:
        """One optimizer step; returns the loss. Raises NonFiniteLoss on nan/inf."""
        x, y = (knobs.to_device(t, self.device, self.cfg) for t in batch)
        with self.precision.autocast():
            loss = self.pipeline.loss(self.model(x), y)
        self.precision.scaler.scale(loss).backward()
        self.precision.scaler.step(self.optimizer)
        self.precision.scaler.update()
        self.optimizer.zero_grad(set_to_none=self.cfg.set_to_none)
        value = loss.item()  # a device sync too: the step is finished when this returns
        if not math.isfinite(value):
            raise NonFiniteLoss(f"loss became {value}")
        return value

    def batches(self) -> Iterator[Any]:
        return batches(self.loader)


def batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Endless batches: a short dataset simply starts another epoch (reshuffled)."""
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def build(cfg: TrialConfig) -> Harness:
    """Process setup, pipeline, and every knob, in the order they must be applied."""
    import torch.distributed as dist

    rank, world, local_rank = knobs.dist_env()
    device = knobs.pick_device(local_rank)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    applied: dict[str, Any] = knobs.setup_process(cfg, device)
    torch.manual_seed(cfg.seed + rank)

    pipeline = load_pipeline(cfg)
    default = TrialConfig()
    refused = [k for k in sorted(unsupported_of(pipeline) & set(KNOBS)) if getattr(cfg, k) != getattr(default, k)]
    if refused:
        raise TrialUnsupported(f"the pipeline does not support: {', '.join(refused)}")
    model = pipeline.build_model()
    applied |= knobs.wrap_checkpoints(model, stages_of(pipeline), cfg.checkpoint_segments)
    model, a = knobs.prepare_model(model, cfg, device, world)
    applied |= a
    model.train()
    optimizer, a = knobs.build_optimizer(model.parameters(), cfg)
    applied |= a
    loader, a = knobs.build_loader(pipeline.build_dataset(), cfg, rank, world, device)
    applied |= a
    precision = knobs.Precision(cfg, device)
    applied |= precision.applied
    applied["set_to_none"] = {"requested": cfg.set_to_none, "in_effect": cfg.set_to_none}
    return Harness(cfg, device, rank, world, pipeline, model, optimizer, loader, precision, applied)
