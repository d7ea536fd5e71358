"""tf32: TF32 for fp32 matmuls and cuDNN convolutions on NVIDIA GPUs from Ampere on
(`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`): tensor cores multiply fp32
inputs rounded to a 10-bit mantissa, several times faster. PyTorch leaves matmul TF32 off; off here is torch's
own default (cuDNN's convolutions keep theirs). It changes the rounding of fp32 math: a precision class that
parity checks against the baseline's loss trajectory.

A flag of the process: set before the job runs, by name (`sets`, trial/loop/knobs/__init__.py's
setup_process); read back after it ran (`SEEN`), so a script that sets it itself shows its own value.

- Its space rules: fixed off without CUDA (a CPU has no TF32).
- The exports: the two flags' lines (the diff adds them where the script sets them nowhere); no Trainer has a
  field for both (transformers' `tf32=` sets the same two: named in its notes).

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, Fix, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "tf32"
ROW = knob(False, "TF32 for fp32 matmuls and cuDNN convolutions (Ampere and later)", visit=8, math="precision")
SEEN = "torch.backends.cuda.matmul.allow_tf32"
NO_CUDA = "no CUDA device: a CPU has no TF32"
FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")


def sets(value: Any) -> dict[str, Any]:
    """On: both flags; off: torch's own defaults, untouched."""
    return dict.fromkeys(FLAGS, True) if value else {}


def machine(hw: Machine) -> list[Rule]:
    return [] if hw.cuda else [Fix(False, "no CUDA, TF32 is a format of NVIDIA GPUs' tensor cores")]


def math_change(cfg: TrialConfig, base: TrialConfig) -> str | None:
    """The training math it changes (fp32 matmuls rounded to TF32), as core/training.py labels a class."""
    if cfg.tf32 == base.tf32:
        return None
    return f"tf32 {'on' if base.tf32 else 'off'} -> {'on' if cfg.tf32 else 'off'}"


def _lines(cfg: TrialConfig) -> list[str]:
    return [f"{flag} = True  # autotune: tf32" for flag in FLAGS] if cfg.tf32 else []


def row(cfg: TrialConfig, target: str) -> str:
    if not cfg.tf32:
        return "off (torch's default), nothing to do"
    if target == "hf":
        return "tf32=True"
    return f"{IN_SCRIPT}, {' and '.join(FLAGS)} = True" if target == "accelerate" else "torch's flags (see below)"


def lightning_extra(cfg: TrialConfig) -> list[str]:
    return _lines(cfg)


def framework_notes(cfg: TrialConfig, target: str) -> list[str]:
    """Beside a Trainer's arguments: a framework trial set the flags in its process, as a script's would."""
    return _lines(cfg)


def hf_args(cfg: TrialConfig) -> list[str]:
    return ["    tf32=True,  # tf32: sets both flags"] if cfg.tf32 else []


def accelerate_code(cfg: TrialConfig) -> list[str]:
    return _lines(cfg)


def script_lines(cfg: TrialConfig) -> list[str]:
    return _lines(cfg)
