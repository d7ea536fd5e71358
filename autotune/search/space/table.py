"""The knob table a user reads (`autotune knobs`, README's "What it searches"): each knob's declaration in
TrialConfig beside the values a space gives it. One source, so the page cannot drift from the code."""

from __future__ import annotations

from typing import Any

from autotune.core.config import IN_EFFECT_WHEN, TABLE
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace

HEADER = ("knob", "what it sets", "default", "default space", "can change the training math")


def word(value: Any) -> str:
    """A value as YAML writes it: false, true, null, 8, bf16."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def values(space: SearchSpace, name: str) -> str:
    if name not in space:
        return "not searched"
    spec = space[name]
    if isinstance(spec, IntRange):
        return f"{spec.low}-{spec.high}"
    if isinstance(spec, Choices):
        return ", ".join(word(v) for v in spec.values)
    assert isinstance(spec, Fixed)
    return f"fixed: {word(spec.value)}"


def rows(space: SearchSpace) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k in TABLE:
        sets = f"{k.sets} ({IN_EFFECT_WHEN[k.needs]})" if k.needs else k.sets
        out.append((f"`{k.name}`", sets, f"`{word(k.default)}`", values(space, k.name), k.math or "no"))
    return out


def markdown(space: SearchSpace) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(space)]
    return "\n".join(lines) + "\n"
