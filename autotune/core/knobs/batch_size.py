"""batch_size: the samples one process trains on per forward (the micro-batch under a study's `--global-batch`,
where the accumulation makes up the rest). It changes the training math: the global batch, the lr that
follows it (the study's rule: sqrt for Adam's family, linear for SGD's), and the span of batch-norm
statistics; a class that parity or time to target checks.

- Its space rules: the values the memory estimate fits on the device, and under `--global-batch` those that
  divide it (search/space/resolve.py, search/space/memory.py: they read the study and the pipeline, not the
  machine alone).
- Autotune's pipelines: their DataLoader's batch_size (trial/loop/loading.py), the lr scaled for the global
  batch (TrialConfig.effective_lr).
- An unedited script: handed over where the run shows the script takes its batch: the DataLoaders built with
  its own batch, by the seams (trial/loop/script/loader.py's handed_batch), else its own command-line option
  that its DataLoader reads, else `at.batch_size()`; its lr scaled from its own global batch
  (trial/loop/script/running.py's batch_handover; records.py there records the batch and lr the run
  showed). Under torchrun it is each rank's.
- The Trainers: Lightning's rebuilt train DataLoader's batch_size; HF's per_device_train_batch_size (`hf_fields`,
  the user's own from `hf_own`).
- The exports: the knob table's `row`; a script's DataLoader(...) and at.batch_size() edits are the diff's
  (apply/export/_loader.py).

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "batch_size"
ROW = knob(
    8,
    "samples per step and process (the micro-batch under `--global-batch`)",
    visit=1,
    math="the global batch and its lr; the batch-norm span",
)
HF = "per_device_train_batch_size"


def hf_fields(cfg: TrialConfig, args: Any) -> dict[str, Any]:
    """The TrainingArguments field it sets."""
    return {HF: cfg.batch_size}


def hf_own(args: Any) -> int:
    """The user's own, from their TrainingArguments."""
    return int(getattr(args, HF))


def hf_lines(cfg: TrialConfig) -> list[str]:
    return [f"    {field}={value!r}," for field, value in hf_fields(cfg, None).items()]


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        return "dataloader_kwargs['batch_size'] (per process)"
    if target == "hf":
        return HF
    return f"{IN_SCRIPT}, DataLoader(batch_size=...) per process"
