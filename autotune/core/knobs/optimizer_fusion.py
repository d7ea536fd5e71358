"""optimizer_fusion: the optimizer's implementation: `none` (torch's per-parameter for-loop), `foreach` (one
kernel a step over lists of tensors), `fused` (one fused kernel: torch's fused AdamW), `apex` (NVIDIA apex's
FusedAdam). Speed only: the update computed is AdamW's in each.

- Its space rules: apex only where `apex.optimizers` imports.
- Autotune's pipelines: torch's AdamW built with `FLAGS[value]` (apex's FusedAdam for apex), its torch side
  trial/loop/knobs/optimizer_fusion.py, with the seam that sets an unedited script's pair.
- An unedited script: the fused/foreach pair set on each torch optimizer whose param groups hold both, before
  its first step, by the seams; an optimizer without the pair keeps its own; apex cannot reach it
  (`script_refused`: its optimizer's class is its own).
- Hugging Face's Trainer: TrainingArguments' `optim`, one AdamW kernel each (`HF`); a Trainer whose optim is
  no AdamW kernel cannot take it. Lightning: the LightningModule builds its own optimizer.
- The exports: the optimizer's construction and its row in the knob table, written with the step they
  belong to (its lr, weight decay and zero_grad: apply/export/_step.py), from `FLAGS` and `HF`.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import Drop, Guided, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "optimizer_fusion"
VALUES = ("none", "foreach", "fused", "apex")
ROW = knob("none", "the optimizer's implementation (AdamW's fused/foreach)", choices=VALUES, visit=6)
NOT_IN = {"lightning": "the LightningModule builds its own optimizer in configure_optimizers()"}
# The torch optimizer's flags for each value (apex is another optimizer): none forces the for-loop.
FLAGS: dict[str, dict[str, bool]] = {"none": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
# torch.optim classes that take both `fused` and `foreach`: the diff writes the flags into their calls only (the
# trial reads the pair off an optimizer's param groups, whatever its class).
FUSABLE = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
# The trials' weight decay: torch.optim.AdamW's own default. apex's FusedAdam defaults to 0, so it is passed to
# both explicitly (apex vs torch must compare the same training), and every export writes it out: a framework
# whose default differs (HF's is 0) must still train what was measured.
WEIGHT_DECAY = 0.01
# TrainingArguments.optim for each. "adamw_torch" lets torch choose its kernel (foreach on CUDA, the for-loop
# on the CPU): TrainingArguments cannot force either, so none and foreach both map there.
HF = {"none": "adamw_torch", "foreach": "adamw_torch", "fused": "adamw_torch_fused", "apex": "adamw_apex_fused"}
HF_ADAMW = frozenset(HF.values())


def machine(hw: Machine) -> list[Rule]:
    return [] if hw.apex else [Drop(("apex",), "apex.optimizers is not installed")]


def script_refused(own: Any, calls: Collection[str]) -> dict[str, str]:
    """An unedited script's optimizer is its own: the trial sets its fused/foreach pair, and cannot swap in
    apex's FusedAdam for it."""
    return {"apex": "the script builds its own optimizer: the trial sets its fused/foreach flags, not apex's class"}


def guide(on: Guided) -> dict[str, Any]:
    """The guides' optimizer: torch's fused AdamW."""
    return {NAME: "fused"}


def flags(value: str) -> str:
    """The torch optimizer's flags for `value`, as a call writes them."""
    return ", ".join(f"{k}={v}" for k, v in FLAGS[value].items())


def hf_optim(args: Any) -> str:
    return str(getattr(args.optim, "value", args.optim))  # an OptimizerNames enum once parsed


def hf_fields(cfg: TrialConfig, args: Any) -> dict[str, Any]:
    """The TrainingArguments field it sets."""
    return {"optim": HF[cfg.optimizer_fusion]}


def hf_own(args: Any) -> str | None:
    """The user's own, from their TrainingArguments: the first value naming its AdamW kernel (None: its optim
    is none of them, and the Trainer cannot take the knob)."""
    return next((k for k, v in HF.items() if v == hf_optim(args)), None)


def hf_unfit(args: Any) -> str | None:
    """Why a Trainer whose base arguments train with another optimizer cannot take it, or None."""
    if hf_optim(args) in HF_ADAMW:
        return None
    return f"the base TrainingArguments train with optim={hf_optim(args)!r}; the knob chooses among AdamW kernels"
