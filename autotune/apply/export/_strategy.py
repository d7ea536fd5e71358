"""The processes a trial ran (gpus) and its strategy (parallel: ddp | fsdp, and FSDP's sub-knobs) in each
framework's terms: what its settings can hold (the launch, accelerate's FSDP plugin with fsdp_version 2,
HF's `fsdp`/`fsdp_config`, Lightning's devices and ModelParallelStrategy), and where the rest goes."""

from __future__ import annotations

from typing import Any

from autotune.apply.export._common import IN_SCRIPT
from autotune.core.config import TrialConfig

_DTYPE = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}


def where(cfg: TrialConfig, fields: dict[str, str]) -> dict[str, str]:
    """The knob table's rows for the strategy knobs: `fields` names the target's own field per knob (those
    it holds), every other row says where it goes or why nothing is to be done."""
    if cfg.gpus == 1:
        return {k: "one process: no strategy to set" for k in ("parallel", *_SUB)}
    if not cfg.sharded:
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


def _fsdp_config(cfg: TrialConfig) -> dict[str, Any]:
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
    """TrainingArguments lines: fsdp=True with an FSDP2 fsdp_config (none without fsdp)."""
    if not cfg.sharded:
        return []
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


def rows(cfg: TrialConfig, target: str, on_cpu: bool = False) -> dict[str, str]:
    """The knob table's rows for gpus, parallel and the fsdp sub-knobs, in `target`'s terms (on_cpu: measured
    on CPU, which accelerate runs as MULTI_CPU)."""
    if target == "lightning":
        return {"gpus": "trainer_kwargs['devices']" + (" + strategy='ddp'" if cfg.gpus > 1 else "")} | where(
            cfg,
            {
                "parallel": "trainer_kwargs['strategy'] = ModelParallelStrategy() (FSDP2) + AutotuneHooks.configure_model",
                "fsdp_reshard": "AutotuneHooks.configure_model (fully_shard)",
                "fsdp_param_dtype": "AutotuneHooks.configure_model (MixedPrecisionPolicy)",
                "fsdp_reduce_dtype": "AutotuneHooks.configure_model (MixedPrecisionPolicy)",
                "fsdp_offload": "AutotuneHooks.configure_model (offload_policy)",
            },
        )
    if target == "hf":
        one_dtype = "no field: bf16=True casts params and reduce alike (see below)"
        return {"gpus": f"not a TrainingArguments field: launch with {_hf_launch(cfg)}"} | where(
            cfg,
            {
                "parallel": "fsdp=True, fsdp_config['version'] = 2",
                "fsdp_reshard": "fsdp_config['reshard_after_forward']",
                "fsdp_offload": "fsdp_config['cpu_offload']",
                "fsdp_param_dtype": one_dtype,
                "fsdp_reduce_dtype": one_dtype,
            },
        )
    return {"gpus": f"num_processes: {cfg.gpus}, distributed_type: {_distributed_type(cfg, on_cpu)}"} | where(
        cfg,
        {
            "parallel": "distributed_type: FSDP, fsdp_version: 2; name your block class in fsdp_transformer_layer_cls_to_wrap",
            "fsdp_reshard": "fsdp_config.fsdp_reshard_after_forward",
            "fsdp_offload": "fsdp_config.fsdp_offload_params",
            "fsdp_param_dtype": f"{IN_SCRIPT}, the FSDP plugin's mixed_precision_policy",
            "fsdp_reduce_dtype": f"{IN_SCRIPT}, the FSDP plugin's mixed_precision_policy",
        },
    )


def _distributed_type(cfg: TrialConfig, on_cpu: bool) -> str:
    if cfg.gpus == 1:
        return "NO"
    return "FSDP" if cfg.sharded else "MULTI_CPU" if on_cpu else "MULTI_GPU"


def accelerate_conf(cfg: TrialConfig, on_cpu: bool) -> dict[str, Any]:
    """accelerate's process layout: distributed_type, num_processes, and under fsdp its `fsdp_config:`."""
    conf: dict[str, Any] = {"distributed_type": _distributed_type(cfg, on_cpu), "num_processes": cfg.gpus}
    if cfg.sharded:
        conf["fsdp_config"] = _fsdp_config(cfg)
    return conf


def _hf_launch(cfg: TrialConfig) -> str:
    n = cfg.gpus
    return (
        f"torchrun --nproc-per-node {n} train.py  (or: accelerate launch --num_processes {n} train.py)"
        if n > 1
        else "python train.py (one process)"
    )


def accelerate_plugin(cfg: TrialConfig) -> list[str]:
    """The script's Accelerator line; under fsdp with the plugin that holds the mixed-precision policy (the
    config file's fsdp_config has no field for the reduce dtype)."""
    if not cfg.sharded:
        return [f"accelerator = Accelerator(gradient_accumulation_steps={cfg.grad_accum!r})"]
    return [
        "from accelerate.utils import FullyShardedDataParallelPlugin",
        "from torch.distributed.fsdp import MixedPrecisionPolicy",
        "plugin = FullyShardedDataParallelPlugin(  # parallel=fsdp; the rest comes from fsdp_config",
        f"    fsdp_version=2, mixed_precision_policy={mp_policy(cfg)})",
        f"accelerator = Accelerator(gradient_accumulation_steps={cfg.grad_accum!r}, fsdp_plugin=plugin)",
    ]


def hf_notes(cfg: TrialConfig) -> list[str]:
    launch = [f"# gpus={cfg.gpus}: launch with {_hf_launch(cfg)}"]
    if not cfg.sharded:
        return launch
    return launch + [
        f"# parallel=fsdp: the trials used {mp_policy(cfg)}; TrainingArguments sets one dtype for both "
        "(bf16=True: bf16 params and reduce), so a different pair needs the accelerate FSDP plugin's "
        "mixed_precision_policy"
    ]


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    """trainer_kwargs' devices and strategy: FSDP2 through ModelParallelStrategy, DDP, or none for one process."""
    devices = [f"    devices={cfg.gpus!r},"]
    if cfg.sharded:
        return devices + [
            f"    strategy=ModelParallelStrategy(data_parallel_size={cfg.gpus!r}, tensor_parallel_size=1),"
            "  # parallel=fsdp: FSDP2, applied in configure_model"
        ]
    return devices + (
        ["    strategy='ddp',  # one process per device, as autotune measured it"] if cfg.gpus > 1 else []
    )


def lightning_hook(cfg: TrialConfig) -> list[str]:
    """AutotuneHooks.configure_model under fsdp: the trials' sharding, where Lightning wants it."""
    if not cfg.sharded:
        return []
    return [
        "",
        "    def configure_model(self):",
        "        # parallel=fsdp: shard each block, then the module, as the trials did",
        "        blocks = self.blocks  # yours: the repeated layers (e.g. self.layers)",
        *fully_shard_code(cfg, "self", "        "),
    ]
