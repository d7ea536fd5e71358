"""A Lightning trial: the user's LightningModule and LightningDataModule under Lightning's own
Trainer.fit, with the knobs as Trainer arguments and the datamodule's train loader rebuilt, measured by
a Callback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from autotune.core.config import TrialConfig
from autotune.core import knobs as described
from autotune.core.effects import effects as core_effects, knob_effect, lr_effect
from autotune.core.errors import PipelineError
from autotune.core.config import lr_scale
from autotune.pipelines.frameworks import threads
from autotune.pipelines.frameworks.lightning import LightningJob, loader_kwargs, trainer_kwargs
from autotune.trial.loop import knobs
from autotune.trial.loop.frameworks import FOREVER
from autotune.trial.loop.harness import checked
from autotune.trial.measurement import observe
from autotune.trial.measurement.clock import Clock


def train(cfg: TrialConfig, job: LightningJob, clock: Clock, device: torch.device, workdir: Path) -> dict[str, Any]:
    """Trainer.fit for the trial's steps; returns what each knob put in effect."""
    import lightning.pytorch as pl

    cuda = device.type == "cuda"
    applied: dict[str, Any] = {}
    own_batches: list[int] = []  # the datamodule's own batch size: what the module's lr is meant for
    data_seed = cfg.seed if cfg.data_seed is None else cfg.data_seed
    original = job.datamodule.train_dataloader

    def train_dataloader() -> DataLoader[Any]:  # Lightning calls it after the datamodule's setup()
        own = original()
        loader, effects = rebuild(own, cfg, cuda, data_seed)
        applied.update(effects)
        own_batches.append(own.batch_size)
        clock.loader(loader)  # what its workers make ahead is drained before the timed steps
        return loader

    job.datamodule.train_dataloader = train_dataloader  # this instance only: its class is the user's
    module = job.module
    if cfg.compile != "off":  # Lightning fits a compiled module, compiling it again around its strategy
        backend = os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor")
        module = torch.compile(module, backend=backend, mode=cfg.compile if backend == "inductor" else None)
    measurement = dict(
        max_steps=cfg.untimed_steps + cfg.timed_steps if cfg.seconds is None else FOREVER,
        max_epochs=-1,
        callbacks=[meter(pl, cfg, clock, applied, own_batches)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,  # the trial measures training; validation is not timed
        default_root_dir=str(workdir),
    )
    # The user's own Trainer arguments (gradient clipping, ...), under the tuned ones and the measurement's.
    trainer = pl.Trainer(**job.trainer_args | trainer_kwargs(cfg, cuda) | placement(cfg, device) | measurement)
    layer, where = observe.first_layer(job.module)  # what the Trainer's precision computed in
    output = observe.OutputDtype(layer if cfg.compile == "off" else None, where)
    trainer.fit(module, datamodule=job.datamodule)
    output.close()
    applied |= effects(cfg, job, trainer, cuda)
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    applied["observed"] = output.seen | observe.in_job(job.module, optimizer, device, clock.util)
    applied["framework"]["lr_scale"] = lr_scale(cfg, own_batches[0])
    return applied


def placement(cfg: TrialConfig, device: torch.device) -> dict[str, Any]:
    """The Trainer's devices and strategy when the ranks may share GPUs (AUTOTUNE_DDP_BACKEND=gloo), over
    trainer_kwargs' devices=N, strategy="ddp"; nothing to change otherwise.

    devices=2 on one GPU fails: under torchrun Lightning skips its check of the visible GPUs and puts rank 1
    on cuda:1, which does not exist, and its backend for CUDA would be nccl, which refuses two ranks on one
    GPU. A DDPStrategy handed each rank's device (rank r on GPU r mod count, as knobs.pick_device) and gloo
    is what Lightning accepts; `devices` then only has to name GPUs that exist, and the strategy's
    parallel_devices set the ranks (Lightning keeps a strategy's own over the devices flag)."""
    if not _ranks_may_share(cfg, device.type == "cuda"):
        return {}
    from lightning.pytorch.strategies import DDPStrategy

    count = torch.cuda.device_count()
    ranks = [torch.device("cuda", r % count) for r in range(cfg.gpus)]
    strategy = DDPStrategy(parallel_devices=ranks, process_group_backend=knobs.ddp_backend(device))
    return {"devices": len(set(ranks)), "strategy": strategy}


def meter(pl: Any, cfg: TrialConfig, clock: Clock, applied: dict[str, Any], own_batches: list[int]) -> Any:
    """The Callback that measures the fit: one optimizer step ends at the micro-batch after which the
    Trainer's global_step moved (accumulate_grad_batches micro-batches per step)."""

    class Meter(pl.Callback):
        def __init__(self) -> None:
            self.optimizer_steps = 0
            self.step_loss = torch.zeros(())

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # After the optimizers and the train loader exist, before the first step.
            applied["lr"] = scale_lr(trainer, cfg, own_batches[0])
            self.step_loss = torch.zeros((), device=pl_module.device)
            clock.begin()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            clock.fetched()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            if isinstance(loss, torch.Tensor):  # already divided by accumulate_grad_batches: the sum is the mean
                self.step_loss = self.step_loss + loss.detach().float()
            if trainer.global_step == self.optimizer_steps:  # accumulating: no optimizer step yet
                clock.fetching()
                return
            self.optimizer_steps = trainer.global_step
            value, self.step_loss = float(self.step_loss), torch.zeros_like(self.step_loss)
            if clock.step_end(value):
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            clock.close(losses_per_rank=True)

    return Meter()


def scale_lr(trainer: Any, cfg: TrialConfig, own_batch: int) -> dict[str, Any]:
    """The module's own lr, meant for its datamodule's batch, scaled by the study's rule to the config's
    global batch: each param group's and its scheduler's base, so a schedule keeps its shape."""
    factor = lr_scale(cfg, own_batch)
    groups = [g for opt in trainer.optimizers for g in opt.param_groups]
    before = [g["lr"] for g in groups]
    if factor != 1:
        for g in groups:
            g["lr"] *= factor
            if "initial_lr" in g:
                g["initial_lr"] *= factor
        for config in trainer.lr_scheduler_configs:
            if hasattr(config.scheduler, "base_lrs"):
                config.scheduler.base_lrs = [b * factor for b in config.scheduler.base_lrs]
    return lr_effect(cfg, before, [g["lr"] for g in groups], own_batch)


def rebuild(loader: Any, cfg: TrialConfig, cuda: bool, data_seed: int) -> tuple[DataLoader[Any], dict[str, Any]]:
    """The datamodule's train DataLoader again, around its own dataset, sampler and collate_fn, with the
    config's loader knobs. A shuffling sampler draws from the trial's data seed (parity's twin changes it)."""
    if not isinstance(loader, DataLoader):
        raise PipelineError(
            f"the datamodule's train_dataloader() returned {type(loader).__name__}, expected a torch DataLoader"
        )
    if loader.batch_size is None:
        raise PipelineError(
            "the datamodule's train DataLoader has a batch_sampler of its own; expected one built "
            "with batch_size, which autotune sets"
        )
    dataset, sampler = loader.dataset, loader.sampler
    iterable = isinstance(dataset, IterableDataset)
    if isinstance(sampler, RandomSampler):
        sampler = RandomSampler(
            dataset,  # type: ignore[arg-type]  # map-style datasets have __len__
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=torch.Generator().manual_seed(data_seed),
        )
    kw = loader_kwargs(cfg)
    kw["pin_memory"] = cfg.pin_memory and cuda
    if cfg.num_workers > 0:
        kw["multiprocessing_context"] = loader.multiprocessing_context
    rebuilt = DataLoader(
        dataset if iterable else checked(dataset),
        sampler=None if iterable else sampler,
        collate_fn=loader.collate_fn,
        drop_last=loader.drop_last,
        worker_init_fn=loader.worker_init_fn,
        timeout=loader.timeout,
        **kw,
    )
    return rebuilt, {
        "batch_size": knob_effect(cfg.batch_size, rebuilt.batch_size),
        "num_workers": knob_effect(cfg.num_workers, rebuilt.num_workers),
        "pin_memory": knob_effect(
            cfg.pin_memory,
            rebuilt.pin_memory,
            "" if cuda or not cfg.pin_memory else "no CUDA device: nothing to pin for",
        ),
        "persistent_workers": knob_effect(cfg.persistent_workers, rebuilt.persistent_workers),
        "prefetch_factor": knob_effect(cfg.prefetch_factor, rebuilt.prefetch_factor if cfg.num_workers else None),
        "sampler": {
            "in_effect": type(sampler).__name__ if sampler is not None else None,
            "why": "the datamodule's own; a RandomSampler reseeded with the trial's data seed",
        },
    }


def _ranks_may_share(cfg: TrialConfig, cuda: bool) -> bool:
    return cuda and cfg.gpus > 1 and knobs.ranks_share_gpus()


def gpus_why(cfg: TrialConfig, trainer: Any, cuda: bool) -> str:
    """The Trainer's devices and strategy, as the trial handed them."""
    strategy = trainer.strategy
    if not _ranks_may_share(cfg, cuda):
        return f"Trainer(devices={cfg.gpus}, strategy={type(strategy).__name__})"
    devices = list(strategy.parallel_devices)
    return (
        f"Trainer(devices={len(set(devices))}, strategy={type(strategy).__name__}(parallel_devices="
        f"[{', '.join(map(str, devices))}], process_group_backend={strategy.process_group_backend!r})): "
        f"{cfg.gpus} ranks over gloo on {len(set(devices))} GPU(s) ({knobs.DDP_BACKEND_ENV}=gloo)"
    )


def effects(cfg: TrialConfig, job: LightningJob, trainer: Any, cuda: bool) -> dict[str, Any]:
    """What the Trainer really ran with, knob by knob, and what the export hands back."""
    compiled = "torch.compile(module) before Trainer.fit" if cfg.compile != "off" else ""
    seen = {
        "precision": (
            described.precision.lightning_own({"precision": trainer.precision}),
            f"Trainer(precision={trainer.precision!r})",
        ),
        "gpus": (trainer.world_size, gpus_why(cfg, trainer, cuda)),
        "compile": (cfg.compile, compiled),
    }
    return core_effects(cfg, seen, job.unsupported) | {
        "grad_accum": knob_effect(cfg.grad_accum, trainer.accumulate_grad_batches),
        "batch_norm_layers": sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in job.module.modules()),
        "framework": {
            "library": job.library,
            "trainer_kwargs": trainer_kwargs(cfg, cuda),
            "dataloader_kwargs": loader_kwargs(cfg),
            **threads(cfg),
        },
    }
