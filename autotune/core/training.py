"""What a config changes in the training it computes, next to its baseline: the global batch (and so the
optimizer steps per epoch), the learning rate that follows it, the precision, and the span of batch-norm
statistics, and FSDP's mixed-precision dtypes (a bf16 gradient reduce): the knobs the table declares with
a `math` (core/config.py; a knob with a module says its own change: its `math_change`). The others only change speed (the loader, fusion, checkpointing, the memory
layout, cudnn, the strategy itself: DDP or FSDP at fp32, resharding, offload): they compute the same step,
up to floating-point rounding, and are not listed."""

from __future__ import annotations

from autotune.core import knobs
from autotune.core.config import TrialConfig, baseline_of, lr_factor

SAME = "same"
# What "same" means, said in best.yaml beside the verdict: why such a config needs no check.
SAME_MEANS = (
    "the baseline's global batch, lr, precision and batch-norm span (and FSDP's dtypes): each optimizer step "
    "computes what the baseline's computes, up to floating-point rounding; the knobs that differ (the loader, "
    "fusion, checkpointing, memory layout, cudnn, micro-batch x accumulation) change only how fast, so no "
    "parity check is needed"
)


def training_math(cfg: TrialConfig, batch_norm: bool, ran: float = 1.0) -> list[str]:
    """The changes from `baseline_of(cfg)`, e.g. ["global batch 8 -> 64", "precision fp32 -> bf16"];
    empty: the same training. batch_norm: the model has batch-norm layers (their statistics span one
    micro-batch of one process, so a smaller micro-batch changes what they normalise by). ran: the global
    batch the run delivered over the one the config planned (a script under torchrun that divides its own
    accumulation by the world size runs 1/gpus of it), so the label says the batch, and its lr, that ran."""
    base = baseline_of(cfg)
    out = []
    global_batch = round(cfg.global_batch_size * ran)
    if global_batch != base.global_batch_size:
        out.append(f"global batch {base.global_batch_size} -> {global_batch}")
    lr = cfg.effective_lr if ran == 1 else cfg.lr * lr_factor(global_batch / cfg.reference_batch, cfg.lr_scaling)
    if lr != base.effective_lr:
        out.append(f"lr {base.effective_lr:.3g} -> {lr:.3g} ({cfg.lr_scaling} rule)")
    out += [said for k in knobs.ALL if (said := getattr(k, "math_change", lambda c, b: None)(cfg, base))]
    if batch_norm and cfg.batch_size != base.batch_size:
        out.append(f"batch-norm span {base.batch_size} -> {cfg.batch_size}")
    for what, knob in (("fsdp param dtype", "fsdp_param_dtype"), ("gradient reduce", "fsdp_reduce_dtype")):
        if sharded_dtype(cfg, knob) != sharded_dtype(base, knob):
            out.append(f"{what} {sharded_dtype(base, knob)} -> {sharded_dtype(cfg, knob)}")
    return out


def sharded_dtype(cfg: TrialConfig, knob: str) -> str:
    """An fsdp mixed-precision dtype as training uses it: fp32 (DDP's, one process's) unless FSDP runs.
    A bf16 param dtype computes in bf16 like autocast; a bf16 reduce sums the ranks' gradients in bf16.
    Either keeps the optimizer step, so the class is checked for parity, as precision is."""
    return str(getattr(cfg, knob)) if cfg.sharded else "fp32"


def changes_step(cfg: TrialConfig) -> bool:
    """Whether `cfg`'s optimizer step differs from its baseline's: another global batch, so another lr.
    Such a class is judged by its time to the baseline's loss; one that keeps the step, by parity."""
    base = baseline_of(cfg)
    return cfg.global_batch_size != base.global_batch_size or cfg.effective_lr != base.effective_lr


def shown(changes: list[str] | tuple[str, ...] | None) -> str:
    """One cell: "same", the changes joined, or "?" when unknown (a trial that did not finish)."""
    if changes is None:
        return "?"
    return "; ".join(changes) if changes else SAME


def section(cfg: TrialConfig, changes: list[str] | tuple[str, ...] | None) -> dict[str, object]:
    """best.yaml's `training_math:`: what the exported config computes per optimizer step, whether that
    is the baseline's, and what to do when it is not."""
    base = baseline_of(cfg)
    out: dict[str, object] = {
        "verdict": "unknown" if changes is None else SAME if not changes else "differs",
        "changes": list(changes or []),
        "global_batch": cfg.global_batch_size,
        "micro_batch": cfg.batch_size,
        "processes": cfg.gpus,
        "grad_accum": cfg.grad_accum,
        "lr": cfg.effective_lr,
        "lr_base": cfg.lr,
        "lr_scaling": cfg.lr_scaling,
        "baseline_global_batch": base.global_batch_size,
    }
    if changes is not None and not changes:
        out["same_means"] = SAME_MEANS
    if changes:
        advice = [f"this config trains differently from the baseline ({shown(changes)})."]
        if cfg.global_batch_size != base.global_batch_size:
            advice.append(
                f"To keep the baseline's optimizer step, search with --global-batch "
                f"{base.global_batch_size}; to adopt this one, check accuracy with "
                "`autotune train --config best.yaml --compare-baseline`."
            )
        out["advice"] = " ".join(advice)
    return out
