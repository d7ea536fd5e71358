"""The strategy (parallel: ddp | fsdp, and FSDP's sub-knobs) in each framework's terms: what its settings
can hold (accelerate's FSDP plugin with fsdp_version 2, HF's `fsdp`/`fsdp_config`, Lightning's
ModelParallelStrategy), and where the rest goes, for the knob table."""

from __future__ import annotations

from typing import Any

from autotune.core.config import TrialConfig

_DTYPE = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}


def fsdp_on(cfg: TrialConfig) -> bool:
    """FSDP runs only with more than one process; one process trains the plain model."""
    return cfg.parallel == "fsdp" and cfg.gpus > 1


def where(cfg: TrialConfig, fields: dict[str, str]) -> dict[str, str]:
    """The knob table's rows for the strategy knobs: `fields` names the target's own field per knob (those
    it holds), every other row says where it goes or why nothing is to be done."""
    if cfg.gpus == 1:
        return {k: "one process: no strategy to set" for k in ("parallel", *_SUB)}
    if not fsdp_on(cfg):
        return {
            "parallel": "ddp: one process per device, each with the whole model (the default)",
            **{k: "parallel is ddp: not used" for k in _SUB},
        }
    own = {
        "fsdp_param_dtype": "the mixed-precision policy's param_dtype (see below)",
        "fsdp_reduce_dtype": "the mixed-precision policy's reduce_dtype (see below)",
    }
    return {k: fields.get(k, own.get(k, "see below")) for k in ("parallel", *_SUB)}


_SUB = ("fsdp_reshard", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_offload")


def mp_policy(cfg: TrialConfig) -> str:
    return (
        f"MixedPrecisionPolicy(param_dtype={_DTYPE[cfg.fsdp_param_dtype]}, "
        f"reduce_dtype={_DTYPE[cfg.fsdp_reduce_dtype]})"
    )


def accelerate_config(cfg: TrialConfig) -> dict[str, Any]:
    """accelerate's `fsdp_config:` for its FSDP2 plugin; the wrapped class is the user's block."""
    return {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": cfg.fsdp_reshard,
        "fsdp_offload_params": cfg.fsdp_offload,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "YourBlock",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_activation_checkpointing": False,  # autotune's first-k checkpointing is in the script, not here
    }


def hf_args(cfg: TrialConfig) -> list[str]:
    """TrainingArguments lines: fsdp=True with an FSDP2 fsdp_config."""
    return [
        "    fsdp=True,  # parallel=fsdp: FSDP2, one fully_shard per transformer layer, then the root",
        f"    fsdp_config={{'version': 2, 'reshard_after_forward': {cfg.fsdp_reshard!r}, "
        f"'cpu_offload': {cfg.fsdp_offload!r}, 'auto_wrap_policy': 'TRANSFORMER_BASED_WRAP'}},",
    ]


def fully_shard_code(cfg: TrialConfig, model: str, indent: str) -> list[str]:
    """Python that shards `model` as the trials did: each block, then the root (`blocks` is yours)."""
    offload = "CPUOffloadPolicy()" if cfg.fsdp_offload else "OffloadPolicy()"
    return [
        f"{indent}from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, "
        "fully_shard",
        f"{indent}mp = {mp_policy(cfg)}",
        f"{indent}for block in blocks:  # your repeated layers, deepest first",
        f"{indent}    fully_shard(block, reshard_after_forward={cfg.fsdp_reshard!r}, mp_policy=mp, "
        f"offload_policy={offload})",
        f"{indent}fully_shard({model}, mp_policy=mp, offload_policy={offload})",
    ]
