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
- The exports: accelerate's FSDP2 plugin, HF's `fsdp`/`fsdp_config`, Lightning's ModelParallelStrategy, and
  the fully_shard lines (apply/export/_strategy.py).

May import: the stdlib and the rest of autotune.core.
"""

from __future__ import annotations

from autotune.core.knobs.row import knob

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
