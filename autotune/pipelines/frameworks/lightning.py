"""`--pipeline lightning:MODULE:FACTORY`: the factory returns (LightningModule, LightningDataModule), or
(LightningModule, LightningDataModule, trainer_kwargs): the keyword arguments the user's own Trainer(...)
is built with, so trial 0 runs their precision and cudnn.benchmark and every trial keeps the rest
(gradient_clip_val, ...).

Knobs map onto the Trainer's own arguments (precision, accumulate_grad_batches, devices and strategy,
benchmark) and onto the DataLoader that the datamodule's train_dataloader() returns, rebuilt around its
own dataset, sampler and collate function (batch_size, num_workers, pin_memory, persistent_workers,
prefetch_factor). What the module owns itself cannot be set from outside, so it is not searched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.core import knobs
from autotune.core.config import TrialConfig
from autotune.core.errors import PipelineError
from autotune.pipelines.frameworks import STRATEGY, FrameworkJob


# Knob -> why a Trainer cannot express it (each knob module's NOT_IN: the LightningModule's own code holds them).
UNSUPPORTED = {
    **knobs.not_in("lightning"),
    # autotune runs the Trainer's own DDP; handing it FSDP (and its sub-knobs) is not wired yet.
    **STRATEGY,
}


class LightningJob(FrameworkJob):
    @property
    def module(self) -> Any:
        return self.parts[0]

    @property
    def datamodule(self) -> Any:
        return self.parts[1]

    @property
    def trainer_args(self) -> dict[str, Any]:
        """The user's own Trainer keyword arguments ({} when the factory returned none)."""
        return dict(self.parts[2]) if len(self.parts) > 2 else {}

    def own_baseline(self, global_batch: int | None = None) -> dict[str, Any]:
        """The knobs the user's job runs with today, for trial 0 to measure: the Trainer arguments the factory
        returned (precision, benchmark; own_trainer), and the train DataLoader's batch_size, num_workers,
        pin_memory, persistent_workers and prefetch_factor, read from the loader the datamodule's own
        setup("fit") and train_dataloader() build (what a trial rebuilds). Without trainer_kwargs the precision
        and benchmark stay at autotune's defaults. The loader's part is {} when the datamodule cannot build it
        here (it then fails in the trial, which says why)."""
        return own_trainer(self.trainer_args, global_batch) | _own_loader(self)


def check(spec: str, pl: Any, returned: Any) -> LightningJob | None:
    """The job, or None when the factory returned something else than the two Lightning objects (and,
    optionally, a mapping of Trainer keyword arguments)."""
    if not (
        isinstance(returned, tuple)
        and len(returned) in (2, 3)
        and isinstance(returned[0], pl.LightningModule)
        and isinstance(returned[1], pl.LightningDataModule)
        and (len(returned) == 2 or isinstance(returned[2], Mapping))
    ):
        return None
    return LightningJob(spec, returned, UNSUPPORTED)


def own_trainer(args: Mapping[str, Any], global_batch: int | None) -> dict[str, Any]:
    """The knobs the user's Trainer arguments say (each knob module's `lightning_own`: precision, benchmark).
    An accumulation a study without --global-batch would drop is bad input: the baseline would not be the
    job the user runs."""
    out = knobs.own("lightning_own", args)
    accumulate = args.get("accumulate_grad_batches", 1)
    if accumulate != 1 and global_batch is None:
        raise PipelineError(
            f"Trainer(accumulate_grad_batches={accumulate!r}): pass --global-batch (your batch size x "
            f"{accumulate} x your devices) so every trial keeps that optimizer step"
        )
    return out


def trainer_kwargs(cfg: TrialConfig, cuda: bool) -> dict[str, Any]:
    """The Trainer arguments a config maps to: what a trial passes over the user's own, and what the export
    hands back."""
    return {
        "accelerator": "gpu" if cuda else "cpu",
        "accumulate_grad_batches": cfg.grad_accum,
        **knobs.merged("lightning_fields", cfg),
    }


def loader_kwargs(cfg: TrialConfig) -> dict[str, Any]:
    """The train DataLoader's arguments a config sets; the datamodule's dataset, sampler and collate_fn stay."""
    return {"batch_size": cfg.batch_size} | knobs.loader.arguments(cfg)


def _own_loader(job: LightningJob) -> dict[str, Any]:
    try:
        job.datamodule.setup("fit")
        loader = job.datamodule.train_dataloader()
        return {"batch_size": int(loader.batch_size)} | knobs.loader.own(loader)
    except Exception:  # any error of the user's code: the baseline is then the plain default, as before
        return {}
