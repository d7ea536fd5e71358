"""channels_last: the model's weights and its 4-D inputs in the channels-last memory format (NHWC), which
convolutions on tensor cores and oneDNN run fastest in. Speed only: the math is the same.

- Its space rules: a script's model with no 4-D weights (trial 0's facts)
  changes nothing; a Trainer (Lightning, transformers) has no field for it.
- Autotune's pipelines: the model and each 4-D batch converted (trial/loop/knobs/channels_last.py); under
  FSDP the inputs only (fully_shard refuses a non-contiguous parameter).
- An unedited script: `Module.to(memory_format=...)` in place on the model its optimizer trains, and a forward
  pre-hook that converts its 4-D floating inputs (integer images stay as loaded, in the diff's lines too);
  with `at.model()` the model handed over is converted. Observed: the memory format of its 4-D weights.
- The exports: the lines below, in each target's terms.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.core.knobs.row import IN_SCRIPT, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "channels_last"
ROW = knob(False, "the memory format of the model and its inputs", visit=5)
# The at.* call a script that routes it itself makes.
ROUTE = "model"
# A pipeline or Trainer that cannot take it, and why.
NOT_IN = {
    "lightning": "the module's forward and batch transfer own the memory layout",
    "hf": "TrainingArguments has no memory-layout field: the model and the data collator own it",
}
NO_CONV = "the model the optimizer trains has no 4-D (convolution) weights: channels_last changes nothing"

# An unedited script: what the trial did, and the plain torch the diff writes after the optimizer's statement
# ({m}: the name of the model it trains). torch's own Module.to: a wrapper that overrides `to` (timm's training
# task) may take no memory format.
HOW = "model.to(memory_format=torch.channels_last) on the model the optimizer trains"
LINES = (
    "torch.nn.Module.to({m}, memory_format=torch.channels_last)  # autotune: channels_last, its 4-D float inputs too",
    "{m}.register_forward_pre_hook(lambda _m, args: tuple(a.contiguous(memory_format=torch.channels_last) "
    "if isinstance(a, torch.Tensor) and a.dim() == 4 and a.is_floating_point() else a for a in args))",
)


def model_why(facts: dict[str, object]) -> str | None:
    """Why a script's model (what trial 0 found of it) cannot take it; None: it can."""
    if facts.get("convolutions") == 0:
        return f"its model ({facts.get('model')}) has no 4-D (convolution) weights"
    return None


def at_model(expr: str, cfg: TrialConfig) -> str:
    """`at.model(expr)`'s part, as the torch call it stands for."""
    return f"{expr}.to(memory_format=torch.channels_last)" if cfg.channels_last else expr


def api_lines(cfg: TrialConfig, device: str) -> list[str]:
    if not cfg.channels_last:
        return []
    return ["model = at.model(model)  # channels_last: model.to(memory_format=torch.channels_last)"]


def row(cfg: TrialConfig, target: str) -> str:
    """The knob table's row, in `target`'s terms (lightning, hf, accelerate)."""
    if target == "lightning":
        return (
            "no Trainer flag: AutotuneHooks converts model and batches"
            if cfg.channels_last
            else ("no Trainer flag; off, nothing to do")
        )
    if target == "hf":
        return "not a TrainingArguments field (see below)"
    if not cfg.channels_last:
        return "off, nothing to do"
    if cfg.sharded:
        return f"{IN_SCRIPT}, 4-D inputs only (FSDP shards contiguous weights only)"
    return f"{IN_SCRIPT}, model.to(memory_format=torch.channels_last) + 4-D inputs"


def lightning_hooks(cfg: TrialConfig) -> list[str]:
    """AutotuneHooks': the weights in setup() (not under FSDP, whose fully_shard refuses channels_last
    parameters), the 4-D inputs after each batch moves to the device."""
    if not cfg.channels_last:
        return []
    hooks = []
    if not cfg.sharded:
        hooks += [
            "",
            "    def setup(self, stage):",
            "        # channels_last: the weights, before the strategy moves the model and wraps it in DDP",
            "        # (on_fit_start is too late: DDP's gradient buckets would keep the old strides)",
            "        super().setup(stage)",
            "        self.to(memory_format=torch.channels_last)",
        ]
    return hooks + [
        "",
        "    def on_after_batch_transfer(self, batch, dataloader_idx):",
        "        # channels_last: the 4-D inputs (images); other tensors pass through"
        + ("; under FSDP the inputs only (fully_shard refuses channels_last weights)" if cfg.sharded else ""),
        "        def cl(x):",
        "            return x.contiguous(memory_format=torch.channels_last) "
        "if torch.is_tensor(x) and x.dim() == 4 else x",
        "        return [cl(x) for x in batch] if isinstance(batch, (list, tuple)) else cl(batch)",
    ]


def hf_notes(cfg: TrialConfig) -> list[str]:
    return [
        f"# channels_last={cfg.channels_last}: "
        + (
            "model = model.to(memory_format=torch.channels_last) before Trainer(...), and return 4-D "
            "image batches as .contiguous(memory_format=torch.channels_last) from the data collator"
            if cfg.channels_last
            else "off, nothing to do"
        )
    ]


def accelerate_code(cfg: TrialConfig) -> list[str]:
    if cfg.channels_last and cfg.sharded:
        return ["# channels_last under FSDP: 4-D inputs only, in the loop (fully_shard refuses channels_last weights)"]
    if cfg.channels_last:
        return ["model = model.to(memory_format=torch.channels_last)  # and 4-D inputs likewise, in the loop"]
    return []
