"""A transformers trial: the user's model, dataset and collator under Trainer.train, with the knobs as
TrainingArguments fields over the user's own, measured by a TrainerCallback."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, lr_effect, unsupported_effects
from autotune.core.errors import PipelineError
from autotune.pipelines.frameworks import threads
from autotune.pipelines.frameworks.hf import HFJob, changes, horizon, own_batch, tuned_fields
from autotune.trial.loop import knobs
from autotune.trial.loop.frameworks import FOREVER
from autotune.trial.loop.harness import checked
from autotune.trial.measurement import observe
from autotune.trial.measurement.clock import Clock


def train(cfg: TrialConfig, job: HFJob, clock: Clock, device: torch.device, workdir: Path) -> dict[str, Any]:
    """Trainer.train for the trial's steps; returns what each knob put in effect."""
    import transformers

    cuda = device.type == "cuda"
    base = job.args
    tuned = tuned_fields(cfg, base, cuda, job.unsupported)
    args = arguments(cfg, job, tuned, workdir)
    seen: dict[str, Any] = {}
    trainer = transformers.Trainer(
        model=job.model,
        args=args,
        train_dataset=dataset_of(job),
        data_collator=job.collator,
        callbacks=[meter(transformers, clock, seen)],
    )
    for chatty in (transformers.PrinterCallback, transformers.ProgressCallback):  # a log line per step otherwise
        trainer.remove_callback(chatty)
    # A layer, not the model: under mixed precision accelerate casts the model's outputs back to float32.
    layer, where = observe.first_layer(job.model)
    output = observe.OutputDtype(layer if cfg.compile == "off" else None, where)
    trainer.train()
    output.close()
    applied = effects(cfg, job, args, seen)
    applied["observed"] = output.seen | observe.in_job(job.model, seen.get("optimizer"), device, clock.util)
    applied["framework"] = {
        "library": job.library,
        "training_args": changes(base, tuned),
        "base": {k: getattr(getattr(base, k, None), "value", getattr(base, k, None)) for k in changes(base, tuned)},
        **threads(cfg),
    }
    return applied


def arguments(cfg: TrialConfig, job: HFJob, tuned: dict[str, Any], workdir: Path) -> Any:
    """The user's TrainingArguments with the tuned fields, and the trial's own: its length, a log line per
    step (the loss the callback records; nan kept, not filtered), no saving, evaluation or reporting."""
    base = job.args
    n = len(job.dataset) if hasattr(job.dataset, "__len__") else None
    needed = cfg.untimed_steps + (cfg.timed_steps if cfg.seconds is None else cfg.window)
    span = horizon(base, n, cfg.global_batch_size)
    trial = dict(
        output_dir=str(workdir / "hf"),
        max_steps=max(span or FOREVER, needed),
        logging_strategy="steps",
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",
        eval_strategy="no",
        load_best_model_at_end=False,
        report_to="none",
        disable_tqdm=True,
        push_to_hub=False,
        seed=cfg.seed,
        data_seed=cfg.seed if cfg.data_seed is None else cfg.data_seed,
    )
    if cfg.compile != "off":
        trial["torch_compile_backend"] = os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor")
    try:
        return dataclasses.replace(base, **tuned, **trial)
    except (ValueError, TypeError) as e:  # TrainingArguments' own checks: a combination it refuses
        raise PipelineError(f"TrainingArguments refused the trial's fields: {str(e).splitlines()[0]}") from None


def dataset_of(job: HFJob) -> Any:
    """The user's dataset; a torch map-style one wrapped so that an item that fails to load is named.
    A `datasets.Dataset` stays as it is: the Trainer drops its unused columns by its type."""
    dataset = job.dataset
    if type(dataset).__module__.startswith("datasets.") or not isinstance(dataset, torch.utils.data.Dataset):
        return dataset
    return checked(dataset)


def meter(transformers: Any, clock: Clock, seen: dict[str, Any]) -> Any:
    """The TrainerCallback that measures the run. The Trainer fetches a step's micro-batches before
    on_step_begin, and logs the step's loss (gathered over ranks) after on_step_end."""

    class Meter(transformers.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["loader"], seen["optimizer"] = kw.get("train_dataloader"), kw.get("optimizer")
            clock.loader(seen["loader"])  # what its workers make ahead is drained before the timed steps
            clock.begin()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.fetched()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if clock.step_end():
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                clock.loss(logs["loss"])
                clock.fetching()  # the Trainer's logging is no wait on the loader: the next one starts here

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.close(losses_per_rank=False)  # the Trainer logs the mean over ranks already

    return Meter()


def effects(cfg: TrialConfig, job: HFJob, args: Any, seen: dict[str, Any]) -> dict[str, Any]:
    """What the Trainer really ran with, read from its own objects where it has them."""
    loader, model = seen.get("loader"), job.model
    optimizer = getattr(seen.get("optimizer"), "optimizer", seen.get("optimizer"))  # accelerate wraps it
    cuda = torch.cuda.is_available()
    pinned = bool(getattr(loader, "pin_memory", args.dataloader_pin_memory)) and cuda
    pin_why = "" if cuda else "no CUDA device: pinning is a no-op, and dataloader_pin_memory stays as yours"
    fused = {k: optimizer.defaults.get(k) for k in ("fused", "foreach")} if optimizer is not None else {}
    return {
        "batch_size": knob_effect(
            cfg.batch_size, getattr(loader, "batch_size", None) or args.per_device_train_batch_size
        ),
        "grad_accum": knob_effect(cfg.grad_accum, args.gradient_accumulation_steps),
        "precision": knob_effect(cfg.precision, f"TrainingArguments(bf16={args.bf16}, fp16={args.fp16})"),
        "num_workers": knob_effect(cfg.num_workers, getattr(loader, "num_workers", args.dataloader_num_workers)),
        "pin_memory": knob_effect(cfg.pin_memory, pinned, pin_why),
        "persistent_workers": knob_effect(cfg.persistent_workers, getattr(loader, "persistent_workers", None)),
        "prefetch_factor": knob_effect(cfg.prefetch_factor, getattr(loader, "prefetch_factor", None)),
        "gpus": knob_effect(
            cfg.gpus, args.world_size, "one process per device, under torchrun" if cfg.gpus > 1 else ""
        ),
        "compile": knob_effect(cfg.compile, f"torch_compile={args.torch_compile}, mode={args.torch_compile_mode}"),
        **(
            {
                "optimizer_fusion": knob_effect(
                    cfg.optimizer_fusion,
                    f"optim={getattr(args.optim, 'value', args.optim)} -> {type(optimizer).__name__}({fused})",
                )
            }
            if "optimizer_fusion" not in job.unsupported
            else {}
        ),
        **(
            {
                "checkpoint_segments": knob_effect(
                    cfg.checkpoint_segments,
                    checkpointing(model),
                    "activation (gradient) checkpointing: every layer, or none",
                )
            }
            if "checkpoint_segments" not in job.unsupported
            else {}
        ),
        **unsupported_effects(cfg, job.unsupported),
        "lr": lr_effect(cfg, job.args.learning_rate, args.learning_rate, own_batch(job.args)),
        "batch_norm_layers": sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in job.model.modules()),
    }


def checkpointing(model: Any) -> bool:
    """Whether the model checkpoints its layers, as it says itself (transformers 5 renamed the property)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False
