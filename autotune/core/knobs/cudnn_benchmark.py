"""cudnn_benchmark: `torch.backends.cudnn.benchmark`, cuDNN's autotuner: the first convolution of each shape
times its algorithms and keeps the fastest. Speed only.

A flag of the process: set before the job runs, by name (`sets`, trial/loop/knobs/__init__.py's
setup_process); read back after it ran (`SEEN`), so a script that sets it itself shows its own value.

- Its space rules: fixed off without CUDA (cudnn is not used).
- The exports: the flag's line where the target has no field for it (the diff adds it where the script
  sets it nowhere), Lightning's `benchmark=`.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, Fix, Guided, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "cudnn_benchmark"
ROW = knob(False, "`torch.backends.cudnn.benchmark`", visit=7)
SEEN = "torch.backends.cudnn.benchmark"
NO_CUDA = "no CUDA device: cudnn is unused"


def sets(value: Any) -> dict[str, Any]:
    """The torch flags the process takes for `value`, by name."""
    return {SEEN: value}


def machine(hw: Machine) -> list[Rule]:
    return [] if hw.cuda else [Fix(False, "no CUDA, cudnn is not used")]


def guide(on: Guided) -> dict[str, Any]:
    """The guides' cuDNN autotuner: on wherever cuDNN runs."""
    return {NAME: on.cuda}


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        return "trainer_kwargs['benchmark'] (sets torch.backends.cudnn.benchmark)"
    if target == "hf":
        return "not a TrainingArguments field: torch.backends.cudnn.benchmark (below)"
    return f"{IN_SCRIPT}, torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}"


def lightning_fields(cfg: TrialConfig) -> dict[str, Any]:
    """The Trainer arguments it sets."""
    return {"benchmark": cfg.cudnn_benchmark}


def lightning_own(args: Mapping[str, Any]) -> bool | None:
    """The user's own, from their Trainer arguments (None: they leave it to Lightning)."""
    return None if args.get("benchmark") is None else bool(args["benchmark"])


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    return [f"    benchmark={cfg.cudnn_benchmark!r},  # cudnn_benchmark"]


def framework_notes(cfg: TrialConfig, target: str) -> list[str]:
    """Beside TrainingArguments, which have no field for it (Lightning's Trainer takes `benchmark`)."""
    if target != "hf" or not cfg.cudnn_benchmark:
        return []
    return ["torch.backends.cudnn.benchmark = True  # cudnn_benchmark: not a TrainingArguments field"]


def hf_notes(cfg: TrialConfig) -> list[str]:
    return [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}  # cudnn_benchmark"]


def accelerate_code(cfg: TrialConfig) -> list[str]:
    return [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark!r}"]


def script_lines(cfg: TrialConfig) -> list[str]:
    return [f"torch.backends.cudnn.benchmark = {cfg.cudnn_benchmark}"]
