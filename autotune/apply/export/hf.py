"""Python for transformers.TrainingArguments, with comments for what it cannot hold."""

from __future__ import annotations

from autotune.apply.export import _compute, _step
from autotune.apply.export._table import knob_table
from autotune.core.config import TrialConfig
from autotune.core.knobs import batch_size, loader, strategy


def to_hf(cfg: TrialConfig, *, device: str | None = None) -> str:
    """Python for transformers.TrainingArguments, plus comments for what TrainingArguments cannot hold."""
    args = [
        *batch_size.hf_lines(cfg),
        *_step.hf_args(cfg),
        *loader.hf_lines(cfg),
        *_compute.hf_precision(cfg),
        *_step.hf_optim(cfg),
        *_compute.hf_args(cfg),
        *strategy.hf_args(cfg),
    ]
    if device is not None and device.startswith("cpu"):
        args.append("    use_cpu=True,  # autotune measured this on CPU")
    parts = [
        "# transformers.TrainingArguments fields for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        knob_table(cfg, "hf"),
        *_step.training_lines(cfg),
        "import torch",
        "",
        "training_args = dict(",
        *args,
        ")",
        "",
        *_compute.hf_notes(cfg),
        *strategy.hf_notes(cfg),
        *_step.hf_notes(cfg),
        "",
        "# args = transformers.TrainingArguments(output_dir='out', **training_args)",
    ]
    return "\n".join(parts) + "\n"
