"""Python for transformers.TrainingArguments, with comments for what it cannot hold."""

from __future__ import annotations

from autotune.apply.export import _strategy
from autotune.apply.export._common import WEIGHT_DECAY, knob_table, training_lines
from autotune.core.config import TrialConfig

_HF_OPTIM = {"none": "adamw_torch", "foreach": "adamw_torch", "fused": "adamw_torch_fused", "apex": "adamw_apex_fused"}


def to_hf(cfg: TrialConfig, *, device: str | None = None) -> str:
    """Python for transformers.TrainingArguments, plus comments for what TrainingArguments cannot hold."""
    n = cfg.gpus
    launch = (
        f"torchrun --nproc-per-node {n} train.py  (or: accelerate launch --num_processes {n} train.py)"
        if n > 1
        else "python train.py (one process)"
    )
    where = {
        "num_workers": "dataloader_num_workers",
        "pin_memory": "dataloader_pin_memory",
        "batch_size": "per_device_train_batch_size",
        "precision": "bf16 / fp16",
        "optimizer_fusion": f"optim={_HF_OPTIM[cfg.optimizer_fusion]!r}",
        "checkpoint_segments": "gradient_checkpointing (every layer, see below)",
        "gpus": f"not a TrainingArguments field: launch with {launch}",
        "channels_last": "not a TrainingArguments field (see below)",
        "cudnn_benchmark": "not a TrainingArguments field: torch.backends.cudnn.benchmark (below)",
        "compile": "torch_compile / torch_compile_mode",
        "persistent_workers": "dataloader_persistent_workers",
        "prefetch_factor": "dataloader_prefetch_factor",
        "set_to_none": "not a TrainingArguments field (see below)",
        "num_threads": "not a TrainingArguments field: torch.set_num_threads (below)"
        if cfg.num_threads
        else "0 = torch's default; nothing to set",
    }
    args = [
        f"    per_device_train_batch_size={cfg.batch_size!r},",
        f"    gradient_accumulation_steps={cfg.grad_accum!r},  # global batch {cfg.global_batch_size}",
        f"    learning_rate={cfg.effective_lr!r},",
        # The trials' AdamW: decay 0.01 at a constant lr. TrainingArguments defaults to no decay and an lr
        # decaying linearly to 0, which would train something other than what was measured.
        f"    weight_decay={WEIGHT_DECAY!r},",
        "    lr_scheduler_type='constant',",
        f"    dataloader_num_workers={cfg.num_workers!r},",
        f"    dataloader_pin_memory={cfg.pin_memory!r},",
        f"    dataloader_persistent_workers={cfg.persistent_workers!r},",
        f"    dataloader_prefetch_factor={cfg.prefetch_factor!r},",
        f"    bf16={cfg.precision == 'bf16'!r},",
        f"    fp16={cfg.precision == 'fp16'!r},",
        f"    optim={_HF_OPTIM[cfg.optimizer_fusion]!r},  # optimizer_fusion={cfg.optimizer_fusion}",
    ]
    if cfg.checkpoint_segments:
        args.append(
            f"    gradient_checkpointing=True,  # checkpoint_segments={cfg.checkpoint_segments}: "
            "HF checkpoints every layer, not the first k"
        )
    else:
        args.append("    gradient_checkpointing=False,  # checkpoint_segments=0")
    args.append(f"    torch_compile={cfg.compile != 'off'!r},  # compile={cfg.compile}")
    if cfg.compile != "off":
        args.append(f"    torch_compile_mode={cfg.compile!r},")
    args += _strategy.hf_args(cfg)
    if device is not None and device.startswith("cpu"):
        args.append("    use_cpu=True,  # autotune measured this on CPU")
    notes = [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}  # cudnn_benchmark"]
    if cfg.num_threads:
        notes.append(f"torch.set_num_threads({cfg.num_threads!r})  # num_threads")
    notes += [
        f"# gpus={n}: launch with {launch}",
        f"# channels_last={cfg.channels_last}: "
        + (
            "model = model.to(memory_format=torch.channels_last) before Trainer(...), and return 4-D "
            "image batches as .contiguous(memory_format=torch.channels_last) from the data collator"
            if cfg.channels_last
            else "off, nothing to do"
        ),
        f"# set_to_none={cfg.set_to_none}: Trainer calls model.zero_grad(), which frees grads (set_to_none=True) "
        "in torch >= 2.0" + ("" if cfg.set_to_none else "; to keep zeroed grads, override Trainer.training_step"),
    ]
    notes += _strategy.hf_notes(cfg)
    if cfg.checkpoint_segments:
        notes.append(
            f"# checkpoint_segments={cfg.checkpoint_segments}: gradient_checkpointing needs a model with "
            "gradient_checkpointing_enable() (a transformers PreTrainedModel); it saves more memory and "
            "costs more time than autotune's first-k segments"
        )
    notes.append(
        f"# weight_decay={WEIGHT_DECAY}: the Trainer exempts biases and LayerNorm weights from it; the trials "
        "decayed every parameter"
    )
    if cfg.optimizer_fusion == "none":
        notes.append(
            "# optimizer_fusion=none: 'adamw_torch' lets torch choose (foreach on CUDA). To force the "
            "for-loop AdamW: Trainer(optimizers=(torch.optim.AdamW(model.parameters(), foreach=False), None))"
        )
    elif cfg.optimizer_fusion == "foreach":
        notes.append("# optimizer_fusion=foreach: 'adamw_torch' uses torch's foreach AdamW on CUDA by default")
    parts = [
        "# transformers.TrainingArguments fields for the configuration autotune measured.",
        "# Every tuned knob, and where it goes:",
        knob_table(cfg, where | _strategy.hf_rows(cfg)),
        *training_lines(cfg),
        "import torch",
        "",
        "training_args = dict(",
        *args,
        ")",
        "",
        *notes,
        "",
        "# args = transformers.TrainingArguments(output_dir='out', **training_args)",
    ]
    return "\n".join(parts) + "\n"
