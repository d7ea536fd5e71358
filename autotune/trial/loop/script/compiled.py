"""compile for a script: at.model() hands back the model torch.compile'd, and dynamo's graph count says
whether the script ran it.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

from autotune.pipelines.script import api
from autotune.trial.measurement import observe


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
