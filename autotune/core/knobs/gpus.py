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
- The exports: its row and the launch in each target's terms (torchrun, accelerate's process layout, Lightning's
  devices, `framework_notes`), and for an unedited script with no process group the diff's note that
  `torchrun ... -m autotune run` starts the ranks and does what no line can (`script_notes`, `HOW`).

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs import strategy
from autotune.core.knobs.row import Clip, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "gpus"
ROW = knob(1, "processes under torchrun, one per GPU", visit=3, math="the global batch and its lr", memory=True)
# For a script that sets up no process group (trial/loop/script/ranks.py): no line of it can say that.
HOW = (
    "one process per GPU: the process group set up, the model replicated (DDP) and the training DataLoaders "
    "given a DistributedSampler, with no edit"
)


def machine(hw: Machine) -> list[Rule]:
    n = max(1, hw.gpu_count)
    return [Clip(n, f"only {n} device{'s' if n > 1 else ''} present", strict=True)]


def lightning_fields(cfg: TrialConfig) -> dict[str, Any]:
    """The Trainer arguments it sets: one process per device, as the trial runs under torchrun (Lightning reads
    its environment)."""
    return {"devices": cfg.gpus, "strategy": "ddp" if cfg.gpus > 1 else "auto"}


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        strategy = " + strategy (parallel)" if cfg.sharded else " + strategy='ddp'" if cfg.gpus > 1 else ""
        return "trainer_kwargs['devices']" + strategy
    if target == "hf":
        return f"not a TrainingArguments field: launch with {launch(cfg)}"
    return f"num_processes: {cfg.gpus} (distributed_type below)"


def launch(cfg: TrialConfig) -> str:
    """How a training run starts the processes."""
    n = cfg.gpus
    return (
        f"torchrun --nproc-per-node {n} train.py  (or: accelerate launch --num_processes {n} train.py)"
        if n > 1
        else "python train.py (one process)"
    )


def hf_notes(cfg: TrialConfig) -> list[str]:
    return [f"# gpus={cfg.gpus}: launch with {launch(cfg)}"]


def script_notes(cfg: TrialConfig, own_group: bool, run: str) -> list[str]:
    """The diff's note for a script that sets up no process group of its own (`own_group` False): no line of
    it can say what the trial did; `run` (autotune run's command) does it under torchrun."""
    if cfg.gpus == 1 or own_group:
        return []
    run = run.replace("`autotune run", f"`torchrun --nproc-per-node {cfg.gpus} -m autotune run")
    return [f"gpus {cfg.gpus}: {HOW}; {run}"]


def framework_notes(cfg: TrialConfig, target: str) -> list[str]:
    """Beside a Trainer's arguments: how the processes start (the trial ran under torchrun)."""
    if cfg.gpus == 1:
        return []
    return [
        f"# gpus={cfg.gpus}: one process per device (torchrun --nproc-per-node {cfg.gpus}, or the Trainer's own launch)"
    ]


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    """trainer_kwargs' devices and strategy: FSDP2 through ModelParallelStrategy, DDP, or none for one process."""
    devices = [f"    devices={cfg.gpus!r},"]
    if cfg.sharded:
        return devices + [
            f"    strategy=ModelParallelStrategy(data_parallel_size={cfg.gpus!r}, tensor_parallel_size=1),"
            "  # parallel=fsdp: FSDP2, applied in configure_model"
        ]
    return devices + (
        ["    strategy='ddp',  # one process per device, as autotune measured it"] if cfg.gpus > 1 else []
    )


def accelerate_layout(cfg: TrialConfig, on_cpu: bool) -> dict[str, Any]:
    """accelerate's process layout: distributed_type (on_cpu: measured on CPU, which accelerate runs as
    MULTI_CPU), num_processes, and under fsdp its `fsdp_config:`."""
    kind = "NO" if cfg.gpus == 1 else "FSDP" if cfg.sharded else "MULTI_CPU" if on_cpu else "MULTI_GPU"
    conf: dict[str, Any] = {"distributed_type": kind, "num_processes": cfg.gpus}
    return conf | ({"fsdp_config": strategy.fsdp_config(cfg)} if cfg.sharded else {})
