"""compile: `torch.compile` of the model's forward and its mode: `default`; `reduce-overhead`, which replays
the compiled graphs as CUDA graphs (one launch for a whole step's kernels: what small batches gain most
from); `max-autotune`, which also searches kernel configurations. Speed only: the math is the same.

- Its space rules: fixed off without CUDA (compiling on a CPU takes minutes a trial cannot pay back, and CUDA
  graphs need CUDA).
- Autotune's pipelines: the model compiled after data-parallel wraps it (trial/loop/knobs/compile.py).
- An unedited script: the forward of the model its optimizer trains compiled in place (its hooks run eagerly
  around it); with `at.model()` the model handed back compiled. Recorded, in its reason: dynamo's graph count
  (a model that compiled none ran eagerly: off in effect), and the times inductor skipped CUDA graphs
  (reduce-overhead with a mutated input, a CPU tensor...).
- The exports: the lines below, in each target's terms.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import Fix, Machine, Rule, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAME = "compile"
VALUES = ("off", "default", "reduce-overhead", "max-autotune")
ROW = knob("off", "`torch.compile` and its mode (reduce-overhead: CUDA graphs)", choices=VALUES, visit=4)
ROUTE = "model"
NOT_IN: dict[str, str] = {}

HOW = "torch.compile of the forward of the model the optimizer trains, in place"
LINES = ("{m}.forward = torch.compile({m}.forward, mode={mode!r})  # autotune: compile, its forward in place",)


def machine(hw: Machine) -> list[Rule]:
    if hw.cuda:
        return []
    return [Fix("off", "no CUDA, compiling the model on CPU takes minutes and cannot pay for itself")]


def line_fields(cfg: TrialConfig, site: dict[str, object], device: str) -> dict[str, object]:
    return {"mode": cfg.compile}


def at_model(expr: str, cfg: TrialConfig) -> str:
    if cfg.compile == "off":
        return expr
    mode = "" if cfg.compile == "default" else f", mode={cfg.compile!r}"
    return f"torch.compile({expr}{mode})"


def api_lines(cfg: TrialConfig, device: str) -> list[str]:
    if cfg.compile == "off":
        return []
    return [f"model = at.model(model)  # compile: torch.compile(model, mode={cfg.compile!r})"]


def row(cfg: TrialConfig, target: str) -> str:
    if target == "lightning":
        return "no Trainer flag: torch.compile(model) before trainer.fit (see below)"
    if target == "hf":
        return "torch_compile / torch_compile_mode"
    return "dynamo_config (backend INDUCTOR, dynamo_mode)" if cfg.compile != "off" else "off: no dynamo_config"


def lightning_extra(cfg: TrialConfig) -> list[str]:
    how = (
        "no change"
        if cfg.compile == "off"
        else f"model = torch.compile(model, mode={cfg.compile!r}) before trainer.fit(model)"
    )
    return [f"# compile={cfg.compile}: {how}"]


def hf_fields(cfg: TrialConfig, args: Any) -> dict[str, Any]:
    """The TrainingArguments fields it sets."""
    return {"torch_compile": cfg.compile != "off"} | (
        {"torch_compile_mode": cfg.compile} if cfg.compile != "off" else {}
    )


def hf_own(args: Any) -> str | None:
    """The user's own, from their TrainingArguments (None: a mode the knob has no value for, left at its
    default)."""
    mode = (args.torch_compile_mode or "default") if args.torch_compile else "off"
    return mode if mode in VALUES else None


def hf_args(cfg: TrialConfig) -> list[str]:
    lines = [f"    {field}={value!r}," for field, value in hf_fields(cfg, None).items()]
    return [lines[0] + f"  # compile={cfg.compile}", *lines[1:]]


def accelerate_conf(cfg: TrialConfig) -> dict[str, Any]:
    if cfg.compile == "off":
        return {}
    return {
        "dynamo_config": {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": cfg.compile,
            "dynamo_use_dynamic": False,
            "dynamo_use_fullgraph": False,
        }
    }
