"""compile's torch side (its story: autotune/core/knobs/compile.py). Autotune's pipelines: the model compiled
after data-parallel wraps it (`to_model`). An unedited script: the forward of the model its optimizer trains
compiled in place (`seam`), or at.model() hands back the model torch.compile'd (`handed_seen`). Observed:
dynamo's graph count since, and the times inductor skipped CUDA graphs (reduce-overhead).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from autotune.core.config import TrialConfig
from autotune.core.knobs.compile import NAME as NAME
from autotune.pipelines.script import api
from autotune.trial.measurement import observe

if TYPE_CHECKING:
    from autotune.trial.loop.script.model import Found

# torch.compile's backend: inductor unless set. aot_eager runs dynamo and its DDP optimizer (the graph split
# at bucket boundaries, where higher-order ops such as checkpoint were once refused) without inductor's
# minutes of code generation on a CPU, so the tests can prove compile + DDP + checkpointing trains.
COMPILE_BACKEND_ENV = "AUTOTUNE_COMPILE_BACKEND"


def backend() -> str:
    return os.environ.get(COMPILE_BACKEND_ENV, "inductor")


def _compiled(fn: Any, mode: str) -> Any:
    # mode is inductor's; another backend (the tests' aot_eager) takes none.
    chosen = backend()
    return torch.compile(fn, backend=chosen, mode=mode if chosen == "inductor" else None)


def to_model(model: torch.nn.Module, cfg: TrialConfig) -> torch.nn.Module:
    return model if cfg.compile == "off" else _compiled(model, cfg.compile)


def ran(model: torch.nn.Module, cfg: TrialConfig) -> tuple[str, str]:
    """What autotune's own model showed of it: compiled, or not (a `seen` pair)."""
    return (cfg.compile if observe.is_compiled(model) or cfg.compile == "off" else "off"), ""


# ---- an unedited script's model (trial/loop/script/model.py calls these by the knob list) ----------------


def seam(
    model: torch.nn.Module, cfg: TrialConfig, args: tuple[Any, ...], hooks: list[Any]
) -> tuple[int, tuple[Any, ...]]:
    """The model's forward compiled in place (the module, its parameters and its hooks stay the ones the
    script and the optimizer hold): its hooks run eagerly around the compiled forward, as the trial's
    autocast (entered in one hook, left in another) and DDP's must. The call that finds the model runs
    eagerly (its forward was read before the hooks ran). State: dynamo's graph count before."""
    before = observe.dynamo_graphs() or 0
    model.forward = _compiled(model.forward, cfg.compile)
    return before, args


def seen(found: Found, cfg: TrialConfig, state: int | None) -> tuple[str, str]:
    """Whether the forward compiled in place ran compiled: dynamo compiled graphs since (`state`)."""
    if state is None:
        return "off", "the script's own: its model is not compiled"
    graphs = (observe.dynamo_graphs() or 0) - state
    said = f"{found.where}: its forward torch.compile'd in place, {graphs} graph(s) compiled"
    if cfg.compile == "reduce-overhead" and (skips := observe.cudagraph_skips()):
        said += f"; inductor skipped CUDA graphs {skips} time(s)"
    return (cfg.compile if graphs else "off"), said


def handed_seen(trial: api.Trial, final: dict[str, Any], as_written: bool) -> tuple[str, str]:
    """Whether the model the script ran was compiled: at.model() returned a compiled module, and dynamo
    compiled graphs while the script ran (a script that keeps the module it passed, not the one returned,
    runs eagerly)."""
    if not any(observe.is_compiled(m) for m in trial.handed_back):
        return "off", "through at.model(): the model it returned is not compiled"
    graphs = final.get("compiled_graphs")
    if graphs == 0:
        return (
            "off",
            "at.model() returned a compiled model, but dynamo compiled no graph while the script ran: it runs "
            "the module it passed, not the one at.model() returned",
        )
    mode = trial.compile if trial.compile != "off" else "the script's own torch.compile"
    return mode, f"through at.model(): {graphs} graph(s) compiled" if graphs else ""
