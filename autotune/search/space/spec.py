"""A search space: its knob specs (a choice list, an integer range, a fixed value). reading.py reads one
from YAML, resolve.py narrows it to this machine and study, suggest.py turns it into configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from autotune.core.config import KNOBS, LEADS, TrialConfig, dependents, turns_on

# Shipped inside the package (a wheel install has it too); search_spaces/default.yaml in a checkout
# links here. It documents the format; `--space FILE` replaces it.
DEFAULT_SPACE = Path(__file__).resolve().parent / "default_space.yaml"
_DEFAULTS = TrialConfig()
# The knobs that mean something only with worker processes (declared in TrialConfig: knob's needs): the
# coordinate pass moves them with num_workers.
WORKER_KNOBS = dependents("workers")


@dataclass(frozen=True)
class Choices:
    values: tuple[Any, ...]


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1
    log: bool = False

    def values(self) -> range:
        return range(self.low, self.high + 1, self.step)


@dataclass(frozen=True)
class Fixed:
    value: Any


Spec = Choices | IntRange | Fixed


@dataclass(frozen=True)
class SearchSpace:
    """knob -> Choices | IntRange | Fixed. Knobs not listed keep the base config's value."""

    knobs: Mapping[str, Spec]
    source: str = "<memory>"

    def __getitem__(self, knob: str) -> Spec:
        return self.knobs[knob]

    def __contains__(self, knob: object) -> bool:
        return knob in self.knobs

    def searched(self) -> list[str]:
        """The knobs Optuna actually samples (not Fixed), in KNOBS order."""
        return [k for k in KNOBS if k in self.knobs and not isinstance(self.knobs[k], Fixed)]

    def grid_size(self) -> int:
        n = 1
        for spec in self.knobs.values():
            n *= (
                len(spec.values)
                if isinstance(spec, Choices)
                else len(spec.values())
                if isinstance(spec, IntRange)
                else 1
            )
        return n

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, spec in self.knobs.items():
            if isinstance(spec, Choices):
                out[k] = {"choices": list(spec.values)}
            elif isinstance(spec, IntRange):
                out[k] = {"low": spec.low, "high": spec.high, "step": spec.step, "log": spec.log}
            else:
                out[k] = {"fixed": spec.value}
        return {"source": self.source, "knobs": out}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SearchSpace:
        knobs: dict[str, Spec] = {}
        for k, s in d["knobs"].items():
            if "choices" in s:
                knobs[k] = Choices(tuple(s["choices"]))
            elif "fixed" in s:
                knobs[k] = Fixed(s["fixed"])
            else:
                knobs[k] = IntRange(int(s["low"]), int(s["high"]), int(s.get("step", 1)), bool(s.get("log", False)))
        return cls(knobs=knobs, source=str(d.get("source", "<memory>")))


def singles(knobs: Mapping[str, Spec]) -> dict[str, Spec]:
    """A range or choice list with one value becomes Fixed: Optuna would still record it as a param."""
    out: dict[str, Spec] = {}
    for k, s in knobs.items():
        vals = list(s.values) if isinstance(s, Choices) else list(s.values()) if isinstance(s, IntRange) else None
        out[k] = Fixed(vals[0]) if vals is not None and len(vals) == 1 else s
    return out


def spec_values(spec: Spec) -> list[Any]:
    return (
        list(spec.values)
        if isinstance(spec, Choices)
        else list(spec.values())
        if isinstance(spec, IntRange)
        else [spec.value]
    )


def can_turn_on(needs: str, knobs: Mapping[str, Spec]) -> bool:
    """Whether some value these specs give `needs`' lead turns it on (a lead they leave out: its default)."""
    lead = LEADS[needs]
    return any(turns_on(needs, v) for v in spec_values(knobs.get(lead, Fixed(getattr(_DEFAULTS, lead)))))


__all__ = ["Choices", "Fixed", "IntRange", "SearchSpace", "Spec", "can_turn_on", "singles", "spec_values"]
