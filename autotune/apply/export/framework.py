"""The export of a framework pipeline's study (--pipeline lightning:... or hf:...): the user's own objects,
tuned. For Lightning, the Trainer's keyword arguments and the train DataLoader's; for transformers, the
TrainingArguments fields that differ from the user's base arguments. Each is the dict the winning
trial passed, recorded by the trial itself (`applied.framework`), so what is pasted is what was measured.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from autotune.apply.export import _loader
from autotune.core import knobs
from autotune.core.configfile import Export
from autotune.pipelines import kind_of
from autotune.pipelines.frameworks import hf, lightning


def renders(fmt: str, e: Export) -> bool:
    """Whether `fmt` is the study's own framework (its Kind's) and the trial recorded what it passed that
    framework: then its export is the user's objects, tuned."""
    return bool(e.framework) and kind_of(e.config.pipeline).framework == fmt


def render(e: Export) -> str:
    fw = e.framework or {}
    return _lightning(e, fw) if kind_of(e.config.pipeline).framework == "lightning" else _hf(e, fw)


def _header(e: Export, what: str) -> list[str]:
    trial = e.study.get("trial")
    speed = f"x{e.speedup:.2f} samples/s over the baseline" if e.speedup else "speedup unknown"
    return [
        f"# {what}, as autotune measured them",
        f"# (study {e.study.get('name')!r}, trial {trial}: {speed}; `autotune trial --config best.yaml` "
        "re-measures it).",
    ]


def _kwargs(name: str, values: Mapping[str, Any], comments: Mapping[str, str] | None = None) -> list[str]:
    comments = comments or {}
    rows = [f"    {k}={v!r}," + (f"  # {comments[k]}" if k in comments else "") for k, v in values.items()]
    return [f"{name} = dict(", *rows, ")"]


def _notes(e: Export, target: str, unsupported: Mapping[str, str], lr_scale: float = 1.0) -> list[str]:
    """The lines beside the framework's arguments: the lr rescale, each knob's own (`framework_notes`, in the
    knob list's order: what the framework's arguments cannot hold), and the knobs not tuned."""
    cfg = e.config
    out = []
    if lr_scale != 1:
        out.append(
            f"# lr: multiply your learning rate by {lr_scale:.4g}, as the trials did ({cfg.lr_scaling} rule, "
            f"from your own batch to global batch {cfg.global_batch_size})"
        )
    out += knobs.each("framework_notes", cfg, target)
    out += [f"# {k}: not tuned, {why}" for k, why in unsupported.items()]
    return out


def _imports(notes: list[str]) -> list[str]:
    return ["import torch"] if any(line.startswith("torch.") for line in notes) else []


def is_own_baseline(e: Export) -> bool:
    """Whether the best is the baseline and that baseline is the user's own settings (read from their job,
    or --baseline): then their settings were already the fastest measured, and nothing is to change."""
    return e.config.baseline is not None and e.config.is_baseline


def _lightning(e: Export, fw: Mapping[str, Any]) -> str:
    # A best that is the user's own baseline hands nothing back: the tuned Trainer arguments would only
    # restate (or, where the factory returned no trainer_kwargs, replace) the user's own with settings
    # nothing measured as faster.
    own = is_own_baseline(e)
    loader = (
        ["# your Trainer and train DataLoader were already the fastest measured: keep them as they are"]
        if own
        else ["# your datamodule's train_dataloader(): the same dataset, sampler and collate_fn, with these"]
    )
    notes = _notes(e, "lightning", lightning.UNSUPPORTED, float(fw.get("lr_scale") or 1.0))
    parts = [
        *_header(e, "Lightning Trainer and train DataLoader arguments for your LightningModule"),
        *_imports(notes),
        "",
        *_kwargs(
            "trainer_kwargs",
            {} if own else fw.get("trainer_kwargs") or {},
            {"accumulate_grad_batches": f"global batch {e.config.global_batch_size}"},
        ),
        "",
        *loader,
        *_kwargs("dataloader_kwargs", {} if own else fw.get("dataloader_kwargs") or {}, _loader.LIGHTNING_COMMENTS),
        "",
        *notes,
        "",
        "# these replace your own accelerator, devices, strategy, precision, accumulate_grad_batches, benchmark:",
        "# trainer = lightning.pytorch.Trainer(**{**your_trainer_kwargs, **trainer_kwargs})",
        "# trainer.fit(model, datamodule=datamodule)",
    ]
    return "\n".join(parts) + "\n"


def _hf(e: Export, fw: Mapping[str, Any]) -> str:
    changed, base = fw.get("training_args") or {}, fw.get("base") or {}
    notes = _notes(e, "hf", hf.UNSUPPORTED)
    parts = [
        *_header(e, "TrainingArguments fields that differ from your base arguments"),
        "import dataclasses",
        *_imports(notes),
        "",
        *(
            _kwargs("training_args", changed, {k: f"yours: {base.get(k)!r}" for k in changed})
            if changed
            else ["training_args = dict()  # your base arguments were already the fastest measured"]
        ),
        "",
        *notes,
        "",
        "# args = dataclasses.replace(your_training_args, **training_args)",
        "# trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)",
    ]
    return "\n".join(parts) + "\n"
