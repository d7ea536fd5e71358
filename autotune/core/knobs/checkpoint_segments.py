"""checkpoint_segments: activation checkpointing of the model's first k stages (0 = off): their activations
are recomputed in backward instead of kept, trading compute for memory (a larger batch may then fit). Speed
and memory only: the math is the same (batch norm's running statistics are kept from the recompute).

- Its space rules: fixed off where the pipeline declares no stages, clipped to the stages it declares; a
  script's model with no repeated blocks (trial 0's facts) has nothing to checkpoint; Lightning's Trainer has no
  argument for it; transformers' Trainer checkpoints every layer or none (0 or 1).
- Autotune's pipelines: the stages they declare wrapped in non-reentrant torch.utils.checkpoint
  (trial/loop/knobs/checkpoint_segments.py).
- An unedited script: torch's composable checkpoint on the first k of the repeated blocks of the model its
  optimizer trains. Observed: the blocks that carry the checkpoint hooks and the activation bytes they free.
- The exports: the lines below, in each target's terms.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, Clip, Fix, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "checkpoint_segments"
ROW = knob(0, "activation checkpointing of the first k stages (0 = off)", memory=True)
ROUTE = None
NOT_IN = {"lightning": "the Trainer has no activation-checkpointing argument: the module's forward owns it"}
NO_BLOCKS = "the model the optimizer trains has no repeated blocks (no ModuleList or Sequential of like modules)"

HOW = "torch.distributed._composable.checkpoint(block) on the model's first repeated blocks"
LINES = (
    "from torch.distributed._composable import checkpoint as _checkpoint  # autotune: checkpoint_segments {k}",
    "for _block in {blocks!r}:",
    "    _checkpoint({m}.get_submodule(_block))",
)


def line_fields(cfg: TrialConfig, site: dict[str, Any], device: str) -> dict[str, Any]:
    """LINES' fields: k, and the blocks the trial checkpointed (its record's model site)."""
    return {"k": cfg.checkpoint_segments, "blocks": tuple(site.get("checkpointed") or ())}


def on_stages(stages: int | None) -> list[Rule]:
    """The space's rule from the stages a pipeline declares (none where it finds them only as it runs)."""
    if stages == 0:
        return [Fix(0, "pipeline declares no stages, so checkpointing is off")]
    if stages is not None:
        return [Clip(stages, f"the pipeline has {stages} stages")]
    return []


def model_why(facts: dict[str, object]) -> str | None:
    if facts.get("repeated_blocks") == 0:
        return f"its model ({facts.get('model')}) has no repeated blocks to checkpoint"
    return None


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        return "no Trainer flag: wrap the first k blocks yourself (see below)"
    if target == "hf":
        return "gradient_checkpointing (every layer, see below)"
    return (
        f"{IN_SCRIPT}, torch.utils.checkpoint on the first k blocks"
        if cfg.checkpoint_segments
        else "off, nothing to do"
    )


def lightning_extra(cfg: TrialConfig) -> list[str]:
    k = cfg.checkpoint_segments
    return [
        f"# checkpoint_segments={k}: "
        + (
            "off"
            if k == 0
            else f"in forward(), run the first {k} encoder stages through "
            "torch.utils.checkpoint.checkpoint(stage, x, use_reentrant=False)"
        )
    ]


def hf_field(args: Any) -> str:
    """transformers 5 renamed gradient_checkpointing to activation_checkpointing and keeps the old name as
    an alias resolved once: a copy of resolved arguments that sets only the old name is silently undone."""
    return "activation_checkpointing" if hasattr(args, "activation_checkpointing") else "gradient_checkpointing"


def hf_fields(cfg: TrialConfig, args: Any) -> dict[str, Any]:
    """The TrainingArguments field it sets (HF checkpoints every layer or none: 0 or 1)."""
    return {hf_field(args): cfg.checkpoint_segments > 0}


def hf_own(args: Any) -> int:
    """The user's own, from their TrainingArguments."""
    return int(bool(getattr(args, hf_field(args))))


def hf_args(cfg: TrialConfig) -> list[str]:
    if cfg.checkpoint_segments:
        return [
            f"    gradient_checkpointing=True,  # checkpoint_segments={cfg.checkpoint_segments}: "
            "HF checkpoints every layer, not the first k"
        ]
    return ["    gradient_checkpointing=False,  # checkpoint_segments=0"]


def hf_notes(cfg: TrialConfig) -> list[str]:
    if not cfg.checkpoint_segments:
        return []
    return [
        f"# checkpoint_segments={cfg.checkpoint_segments}: gradient_checkpointing needs a model with "
        "gradient_checkpointing_enable() (a transformers PreTrainedModel); it saves more memory and "
        "costs more time than autotune's first-k segments"
    ]


def accelerate_code(cfg: TrialConfig) -> list[str]:
    k = cfg.checkpoint_segments
    if not k:
        return []
    return [
        f"# checkpoint_segments={k}: run the first {k} "
        "blocks of forward() through torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"
    ]
