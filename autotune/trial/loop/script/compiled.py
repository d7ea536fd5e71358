"""compile for a script: at.model() hands back the model torch.compile'd, or, with no edit, the forward of
the model its optimizer trains is compiled in place (`apply`); dynamo's graph count says whether the script
ran it.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from autotune.pipelines.script import api
from autotune.trial.loop import knobs
from autotune.trial.measurement import observe


def apply(model: torch.nn.Module, mode: str) -> int:
    """The model's forward compiled in place (the module, its parameters and its hooks stay the ones the
    script and the optimizer hold): its hooks run eagerly around the compiled forward, as the trial's
    autocast (entered in one hook, left in another) and DDP's must. Returns dynamo's graph count before."""
    backend = os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor")
    before = dynamo_graphs() or 0
    model.forward = torch.compile(model.forward, backend=backend, mode=mode if backend == "inductor" else None)
    return before


def applied_seen(mode: str, before: int | None, where: str) -> tuple[str, str]:
    """Whether the forward compiled in place ran compiled: dynamo compiled graphs since (`before`)."""
    if before is None:
        return "off", "the script's own: its model is not compiled"
    graphs = (dynamo_graphs() or 0) - before
    return (mode if graphs else "off"), f"{where}: its forward torch.compile'd in place, {graphs} graph(s) compiled"


def handed_seen(trial: api.Trial, seen: dict[str, Any]) -> tuple[str, str]:
    """Whether the model the script ran was compiled: at.model() returned a compiled module, and dynamo
    compiled graphs while the script ran (a script that keeps the module it passed, not the one returned,
    runs eagerly)."""
    if not any(observe.is_compiled(m) for m in trial.handed_back):
        return "off", "through at.model(): the model it returned is not compiled"
    graphs = seen.get("compiled_graphs")
    if graphs == 0:
        return (
            "off",
            "at.model() returned a compiled model, but dynamo compiled no graph while the script ran: it runs "
            "the module it passed, not the one at.model() returned",
        )
    mode = trial.compile if trial.compile != "off" else "the script's own torch.compile"
    return mode, f"through at.model(): {graphs} graph(s) compiled" if graphs else ""


def dynamo_graphs() -> int | None:
    """The graphs dynamo has compiled in this process (a private counter: None where it is absent)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - an observation must not fail a trial
        return None
