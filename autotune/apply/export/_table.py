"""The knob table every framework rendering opens with: each knob's row comes from its module in the knob list
(core/knobs/), the DataLoader's four from theirs, the optimizer's construction and zero_grad with the step
they are written in (_step.py)."""

from __future__ import annotations

from typing import Any

from autotune.apply.export import _step
from autotune.core import knobs
from autotune.core.config import KNOBS, TrialConfig
from autotune.core.knobs import loader, strategy


def knob_table(cfg: TrialConfig, target: str) -> str:
    """One comment line per knob, in KNOBS order, for target "lightning", "hf" or "accelerate". A knob no
    concept module gives a row is a KeyError, on purpose: a new knob must be given a place in every target
    rather than vanish from it."""
    where = (
        loader.rows(target)
        | _step.rows(cfg, target)
        | {k.NAME: k.row(cfg, target) for k in knobs.ALL if hasattr(k, "row")}
        | strategy.rows(cfg, target)
    )
    width = max(len(k) for k in KNOBS)
    rows = [f"#   {k:<{width}} = {_show(getattr(cfg, k)):<12} -> {where[k]}" for k in KNOBS]
    return "\n".join(rows)


def _show(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
