"""`--pipeline hf:MODULE:FACTORY`: the factory returns (model, train_dataset, data_collator, TrainingArguments).

Knobs map onto TrainingArguments fields (`tuned_fields`); a trial runs Trainer.train on the user's
arguments with those fields replaced, and the export is the fields that differ from the user's base.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Mapping

from autotune.core import knobs
from autotune.core.config import TrialConfig
from autotune.core.config import lr_scale
from autotune.pipelines.frameworks import STRATEGY, FrameworkJob

UNSUPPORTED = {
    **knobs.not_in("hf"),
    # autotune runs the Trainer's own DDP; handing it FSDP (and its sub-knobs) is not wired yet.
    **STRATEGY,
}
# HF checkpoints every layer or none: one stage, so checkpoint_segments is 0 or 1.
STAGES = ("gradient_checkpointing",)


class HFJob(FrameworkJob):
    @property
    def model(self) -> Any:
        return self.parts[0]

    @property
    def dataset(self) -> Any:
        return self.parts[1]

    @property
    def collator(self) -> Any:
        return self.parts[2]

    @property
    def args(self) -> Any:
        return self.parts[3]

    def own_baseline(self, global_batch: int | None = None) -> dict[str, Any]:
        """The knobs the user's TrainingArguments train with today, for trial 0 to measure: the batch per
        device, bf16/fp16, the loader's workers, pinning and prefetch, the AdamW kernel (optim), torch_compile
        and gradient checkpointing. Knobs the job cannot express are left out (they stay at their defaults).
        gradient_accumulation_steps is no knob: the study's --global-batch carries it (and the lr scaling
        already starts from the user's own global batch, `own_batch`), so global_batch is not read."""
        return {k: v for k, v in said(self.args).items() if k not in self.unsupported}


def said(args: Any) -> dict[str, Any]:
    """Each knob as TrainingArguments say it: each knob module's `hf_own`, the loader's four by their fields.
    Trial 0 reads the user's own so; a trial reads back the arguments the Trainer took."""
    return knobs.loader.hf_own(args) | knobs.own("hf_own", args)


def check(spec: str, transformers: Any, returned: Any) -> HFJob | None:
    """The job, or None when the factory returned something else than the four parts."""
    import torch

    if not (isinstance(returned, tuple) and len(returned) == 4):
        return None
    model, dataset, collator, args = returned
    sized = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    if not (
        isinstance(model, torch.nn.Module)
        and (sized or isinstance(dataset, torch.utils.data.IterableDataset))
        and (collator is None or callable(collator))
        and isinstance(args, transformers.TrainingArguments)
    ):
        return None
    unsupported = dict(UNSUPPORTED)
    if why := knobs.optimizer_fusion.hf_unfit(args):
        unsupported["optimizer_fusion"] = why
    stages = STAGES if getattr(model, "supports_gradient_checkpointing", False) else ()
    if not stages:
        unsupported["checkpoint_segments"] = "the model has no gradient_checkpointing_enable()"
    return HFJob(spec, returned, unsupported, stages)


def tuned_fields(cfg: TrialConfig, base: Any, cuda: bool, unsupported: frozenset[str]) -> dict[str, Any]:
    """The TrainingArguments fields a config sets over the user's base arguments."""
    out: dict[str, Any] = {
        "gradient_accumulation_steps": cfg.grad_accum,
        **knobs.loader.hf_fields(cfg),
        **knobs.merged("hf_fields", cfg, base, skip=unsupported),
    }
    if not cuda:
        del out[knobs.loader.HF["pin_memory"]]  # pinning is a no-op: the user's setting stays as it is
        if out["bf16"]:  # transformers refuses bf16 without a bf16 GPU unless told the run is on the CPU
            out["use_cpu"] = True
    factor = lr_scale(cfg, own_batch(base))
    if factor != 1:  # another global batch than the user's: the user's lr, scaled by the study's rule
        out["learning_rate"] = base.learning_rate * factor
    return out


def own_batch(base: Any) -> int:
    """The global batch the user's learning rate is meant for: per process, times accumulation."""
    return int(base.per_device_train_batch_size) * int(base.gradient_accumulation_steps)


# A field the user left None that the Trainer then runs at this value: a tuned value equal to it is no
# change (DataLoader prefetches 2 batches per worker by default; torch.compile's mode None is "default").
IMPLIED = {"dataloader_prefetch_factor": 2, "torch_compile_mode": "default"}


def changes(base: Any, tuned: Mapping[str, Any]) -> dict[str, Any]:
    """The tuned fields whose value differs from the user's base: the export, ready to paste."""

    def plain(v: Any) -> Any:
        return getattr(v, "value", v)  # enums (optim) compare and print as their strings

    def same(k: str, v: Any) -> bool:
        own = plain(getattr(base, k, None))
        return own == plain(v) or (own is None and k in IMPLIED and IMPLIED[k] == plain(v))

    return {k: plain(v) for k, v in tuned.items() if not same(k, v)}


def horizon(base: Any, n_samples: int | None, per_step: int) -> int | None:
    """The optimizer steps of the user's own run (max_steps, else its epochs): the span of its lr
    schedule, which a short trial must keep (a warmup ratio of a trial-length schedule would be a few
    steps, of an endless one forever). None when the dataset has no length."""
    if base.max_steps and base.max_steps > 0:
        return int(base.max_steps)
    if n_samples is None:
        return None
    return max(1, math.ceil(base.num_train_epochs * math.ceil(n_samples / per_step)))
