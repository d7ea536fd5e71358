"""A transformers trial: the user's model, dataset and collator under Trainer.train, with the knobs as
TrainingArguments fields over the user's own, measured by a TrainerCallback."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from autotune.core.config import TrialConfig
from autotune.core import knobs as described
from autotune.core.effects import effects as core_effects, knob_effect, lr_effect
from autotune.core.errors import PipelineError
from autotune.pipelines.frameworks import threads
from autotune.pipelines.frameworks.hf import HFJob, changes, horizon, own_batch, said, tuned_fields
from autotune.trial.loop import knobs
from autotune.trial.loop.frameworks import FOREVER
from autotune.trial.loop.harness import checked
from autotune.trial.measurement import observe
from autotune.trial.measurement.clock import Clock


NO_PINNING = "no CUDA device: pinning is a no-op, and dataloader_pin_memory stays as yours"


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
    """What the Trainer really ran with: each knob as the TrainingArguments it took say it (`said`, as trial 0
    reads the user's own), and as its own objects show it where they do: its DataLoader, its optimizer, the
    model it checkpoints."""
    loader, model = seen.get("loader"), job.model
    optimizer = getattr(seen.get("optimizer"), "optimizer", seen.get("optimizer"))  # accelerate wraps it
    cuda = torch.cuda.is_available()
    ran = said(args)
    named = described.fields("hf_fields", cfg, args) | {k: (f,) for k, f in described.loader.HF.items()}
    why = {k: f"TrainingArguments({fields_as_taken(args, fields)})" for k, fields in named.items()}
    if isinstance(loader, torch.utils.data.DataLoader):
        ran |= described.loader.own(loader) | {"batch_size": loader.batch_size or ran["batch_size"]}
        why |= dict.fromkeys([*described.loader.NAMES, "batch_size"], "")
    if not cuda:
        ran["pin_memory"], why["pin_memory"] = False, NO_PINNING
    if optimizer is not None:
        fused = {k: optimizer.defaults.get(k) for k in ("fused", "foreach")}
        why["optimizer_fusion"] = f"{fields_as_taken(args, ['optim'])} -> {type(optimizer).__name__}({fused})"
    ran["checkpoint_segments"] = int(checkpointing(model))
    why["checkpoint_segments"] = "activation (gradient) checkpointing of the model: every layer, or none"
    ranks = (args.world_size, "one process per device, under torchrun" if args.world_size > 1 else "")
    return core_effects(
        cfg,
        {k: (v, why.get(k, "")) for k, v in ran.items() if k not in job.unsupported} | {"gpus": ranks},
        job.unsupported,
    ) | {
        "grad_accum": knob_effect(cfg.grad_accum, args.gradient_accumulation_steps),
        "lr": lr_effect(cfg, job.args.learning_rate, args.learning_rate, own_batch(job.args)),
        "batch_norm_layers": sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in job.model.modules()),
    }


def fields_as_taken(args: Any, fields: Any) -> str:
    """TrainingArguments' `fields` as the Trainer took them (an enum by its value)."""
    return ", ".join(f"{f}={getattr(getattr(args, f), 'value', getattr(args, f))!r}" for f in fields)


def checkpointing(model: Any) -> bool:
    """Whether the model checkpoints its layers, as it says itself (transformers 5 renamed the property)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False
