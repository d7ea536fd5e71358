"""gpus: the processes a trial runs under torchrun, one per GPU, each a rank of one process group; the model
replicated on each (DDP) or sharded over them (FSDP2: `parallel` and its sub-knobs). It changes the training
math: the global batch (the micro-batch x the ranks x the accumulation), and the lr that follows it.

- Its space rules: at most the devices present; a space asking for more is refused, not clipped (it would
  search another job than the one asked for).
- Autotune's pipelines: torchrun launches the ranks (trial/processes/launcher.py); each wraps its model in
  DDP or fully_shards it (trial/loop/sharding.py) and its sampler shards the data.
- An unedited script: it runs under torchrun as it is; one that sets up its own process group keeps its own
  DDP set-up, untouched; for one that sets up none, the trial sets it up, replicates the model it trains in
  place and shards its training DataLoaders (trial/loop/script/ranks.py). The world size and the global batch
  recorded are what the run showed.
- The Trainers: Lightning's `devices` and `strategy` (`lightning_fields`); HF's Trainer reads torchrun's
  environment.
- The exports: the launch and each target's process settings (apply/export/_strategy.py).

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import Clip, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "gpus"
ROW = knob(1, "processes under torchrun, one per GPU", visit=3, math="the global batch and its lr", memory=True)


def machine(hw: Machine) -> list[Rule]:
    n = max(1, hw.gpu_count)
    return [Clip(n, f"only {n} device{'s' if n > 1 else ''} present", strict=True)]


def lightning_fields(cfg: TrialConfig) -> dict[str, Any]:
    """The Trainer arguments it sets: one process per device, as the trial runs under torchrun (Lightning reads
    its environment)."""
    return {"devices": cfg.gpus, "strategy": "ddp" if cfg.gpus > 1 else "auto"}
