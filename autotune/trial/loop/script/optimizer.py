"""The optimizer's knobs for a script: its fused/foreach flags and zero_grad's set_to_none, as its steps ran
them.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

from autotune.core.effects import Seen
from autotune.trial.loop.script.shown import Shown


def fusion_of(group: dict[str, Any]) -> str:
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "none" if "foreach" in group else "unknown"


def seen(shown: Shown, why: str) -> Seen:
    """The optimizer's fusion as its first step ran it, and zero_grad's set_to_none as last called."""
    out: Seen = {}
    if shown.stepped:
        out["optimizer_fusion"] = (shown.stepped[0]["fusion"], why)
    if shown.zero_grads:
        out["set_to_none"] = (shown.zero_grads[-1], why)
    return out
