"""The strategy over the processes: `parallel` (ddp: each rank holds the whole model, its gradients
all-reduced; fsdp: FSDP2, torch's `fully_shard` on each block, then the root) and FSDP's own knobs:
`fsdp_reshard` (reshard_after_forward: ZeRO-3, or ZeRO-2 when false), `fsdp_param_dtype` and
`fsdp_reduce_dtype` (its MixedPrecisionPolicy: a bf16 reduce changes the training math, a class parity
checks), `fsdp_offload` (CPUOffloadPolicy). They mean something only with several processes (`needs`), the
sub-knobs only under fsdp; one module holds the five, as one call's arguments.

- Their space rules: fixed where they have no effect: one process (no strategy), ddp (no sub-knobs), no CUDA
  (the parameters already live in host memory: no offload) (search/space/resolve.py's inert rules).
- Autotune's pipelines: trial/loop/sharding.py shards the model in torch's order (checkpointing, compile per
  block, fully_shard per block bottom-up, then the root) and observes what each knob did.
- An unedited script: not applied. One that sets up no process group gets DDP (torch's replicate) with no
  edit; FSDP needs the script to shard its own model, and one with its own group keeps its own
  (pipelines/script's NO_GROUP, OWN_STRATEGY say so). The Trainers run their own DDP (pipelines/frameworks'
  STRATEGY).
- The exports: their rows (`rows`), accelerate's FSDP2 plugin, HF's `fsdp`/`fsdp_config`, Lightning's
  configure_model hook, and the fully_shard lines; the processes' own (the launch, Lightning's
  ModelParallelStrategy, accelerate's layout) are the gpus module's.

May import: the stdlib and the rest of autotune.core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

PARALLELS = ("ddp", "fsdp")
FSDP_DTYPES = ("fp32", "bf16")
ROWS = {
    "parallel": knob("ddp", "DDP or FSDP2 over the processes", choices=PARALLELS, needs="processes", memory=True),
    "fsdp_reshard": knob(True, "FSDP's reshard_after_forward (true: ZeRO-3, false: ZeRO-2)", needs="fsdp", memory=True),
    "fsdp_param_dtype": knob(
        "fp32",
        "FSDP's MixedPrecisionPolicy param_dtype",
        choices=FSDP_DTYPES,
        needs="fsdp",
        math="param dtype",
        memory=True,
    ),
    "fsdp_reduce_dtype": knob(
        "fp32", "FSDP's MixedPrecisionPolicy reduce_dtype", choices=FSDP_DTYPES, needs="fsdp", math="gradient reduce"
    ),
    "fsdp_offload": knob(False, "FSDP's CPUOffloadPolicy (state in host memory)", needs="fsdp", memory=True),
}

DTYPE = {"fp32": "torch.float32", "bf16": "torch.bfloat16"}
# Where each of the five goes in each target under fsdp: its field, or where instead.
FIELDS = {
    "lightning": {
        "parallel": "trainer_kwargs['strategy'] = ModelParallelStrategy() (FSDP2) + AutotuneHooks.configure_model",
        "fsdp_reshard": "AutotuneHooks.configure_model (fully_shard)",
        "fsdp_param_dtype": "AutotuneHooks.configure_model (MixedPrecisionPolicy)",
        "fsdp_reduce_dtype": "AutotuneHooks.configure_model (MixedPrecisionPolicy)",
        "fsdp_offload": "AutotuneHooks.configure_model (offload_policy)",
    },
    "hf": {
        "parallel": "fsdp=True, fsdp_config['version'] = 2",
        "fsdp_reshard": "fsdp_config['reshard_after_forward']",
        "fsdp_offload": "fsdp_config['cpu_offload']",
        "fsdp_param_dtype": "no field: bf16=True casts params and reduce alike (see below)",
        "fsdp_reduce_dtype": "no field: bf16=True casts params and reduce alike (see below)",
    },
    "accelerate": {
        "parallel": "distributed_type: FSDP, fsdp_version: 2; name your block class in fsdp_transformer_layer_cls_to_wrap",
        "fsdp_reshard": "fsdp_config.fsdp_reshard_after_forward",
        "fsdp_offload": "fsdp_config.fsdp_offload_params",
        "fsdp_param_dtype": f"{IN_SCRIPT}, the FSDP plugin's mixed_precision_policy",
        "fsdp_reduce_dtype": f"{IN_SCRIPT}, the FSDP plugin's mixed_precision_policy",
    },
}


def rows(cfg: TrialConfig, target: str) -> dict[str, str]:
    """The knob table's rows for the five in `target`'s terms: where each goes under fsdp, else why nothing
    is to be done."""
    if cfg.gpus == 1:
        return dict.fromkeys(ROWS, "one process: no strategy to set")
    if not cfg.sharded:
        return {
            "parallel": "ddp: one process per device, each with the whole model (the default)",
            **{k: "parallel is ddp: not used" for k in ROWS if k != "parallel"},
        }
    return {k: FIELDS[target][k] for k in ROWS}


def mp_policy(cfg: TrialConfig) -> str:
    return (
        f"MixedPrecisionPolicy(param_dtype={DTYPE[cfg.fsdp_param_dtype]}, reduce_dtype={DTYPE[cfg.fsdp_reduce_dtype]})"
    )


def fsdp_config(cfg: TrialConfig) -> dict[str, Any]:
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


def hf_notes(cfg: TrialConfig) -> list[str]:
    if not cfg.sharded:
        return []
    return [
        f"# parallel=fsdp: the trials used {mp_policy(cfg)}; TrainingArguments sets one dtype for both "
        "(bf16=True: bf16 params and reduce), so a different pair needs the accelerate FSDP plugin's "
        "mixed_precision_policy"
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
