"""Read a search-space YAML file (search_spaces/*.yaml) into a SearchSpace. Everything that can be wrong
with the file is found here, before a study is touched, and reported as one line naming file and knob."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from autotune.core.config import CHOICES, KNOBS, LEADS, TrialConfig, bare_off, dependents
from autotune.core.errors import ConfigError, SearchSpaceError
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace, Spec, can_turn_on

_TYPES = {f.name: f.type for f in fields(TrialConfig) if f.name in KNOBS}
INT_KNOBS = frozenset(k for k, t in _TYPES.items() if t in ("int", "int | None"))
BOOL_KNOBS = frozenset(k for k, t in _TYPES.items() if t == "bool")
STR_KNOBS = {k: allowed for k, allowed in CHOICES.items() if k in KNOBS}
_RANGE_KEYS = ("low", "high", "step", "log")


def load_space(path: str | os.PathLike[str]) -> SearchSpace:
    """Read and validate a space file. Every problem is a one-line SearchSpaceError."""
    src = str(path)

    def fail(msg: str) -> SearchSpaceError:
        return SearchSpaceError(f"{src}: {msg}")

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise fail("search space file not found") from None
    except OSError as e:
        raise fail(f"cannot read the file ({e.strerror or e})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise fail(f"malformed YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise fail(f"the top level must be a mapping with a 'knobs:' mapping, got {type(doc).__name__}")
    extra = sorted(str(k) for k in doc if k != "knobs")
    if extra:
        raise fail(f"unknown top-level key(s) {', '.join(extra)} (only 'knobs:' is read)")
    raw = doc.get("knobs")
    if not isinstance(raw, dict):
        raise fail("'knobs:' must be a mapping of knob name -> choices, range or value")

    knobs: dict[str, Spec] = {}
    for name, value in raw.items():
        if name not in KNOBS:
            raise fail(f"knob {name!r}: unknown knob (known: {', '.join(KNOBS)})")
        try:
            knobs[name] = _parse_knob(name, value)
        except _Bad as e:
            raise fail(f"knob {name!r}: {e}") from None
    # TrialConfig refuses the worker knobs without workers, so asking for them then is an error in the file;
    # the other dependents are valid with their lead off (a trial leaves them inert).
    for k, inert in dependents("workers").items():
        if k in knobs and knobs[k] != Fixed(inert) and not can_turn_on("workers", knobs):
            raise fail(f"knob {k!r}: only applies with worker processes, but num_workers is fixed to 0")
    return SearchSpace(knobs=knobs, source=src)


class _Bad(Exception):
    pass


def _parse_knob(name: str, value: Any) -> Spec:
    if isinstance(value, dict):
        return _parse_range(name, value)
    if isinstance(value, list):
        if not value:
            raise _Bad("empty choice list")
        vals = tuple(_check_value(name, v) for v in value)
        if len(set(vals)) != len(vals):
            raise _Bad(f"duplicate choices in {list(value)}")
        return Choices(vals)
    return Fixed(_check_value(name, value))


def _parse_range(name: str, d: dict[Any, Any]) -> IntRange:
    if name not in INT_KNOBS:
        raise _Bad("a range {low, high} needs an integer knob; give a list of choices or one value")
    unknown = sorted(str(k) for k in d if k not in _RANGE_KEYS)
    if unknown:
        raise _Bad(f"unknown range key(s) {', '.join(unknown)} (allowed: {', '.join(_RANGE_KEYS)})")
    if "low" not in d or "high" not in d:
        raise _Bad("a range needs both low and high")
    low, high = _check_value(name, d["low"]), _check_value(name, d["high"])
    if low is None or high is None:
        raise _Bad("range bounds must be integers")
    step, log = d.get("step", 1), d.get("log", False)
    if not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        raise _Bad(f"step must be a positive integer, got {step!r}")
    if not isinstance(log, bool):
        raise _Bad(f"log must be true or false, got {log!r}")
    if low > high:
        raise _Bad(f"empty range: low {low} > high {high}")
    if log and low < 1:
        raise _Bad(f"log: true needs low >= 1, got low {low}")
    if log and step != 1:
        raise _Bad("log: true cannot be combined with step")
    if (high - low) % step:
        raise _Bad(f"high - low ({high - low}) must be a multiple of step {step}")
    return IntRange(low, high, step, log)


def _check_value(name: str, v: Any) -> Any:
    """Return v as TrialConfig would hold it, or raise _Bad. Validation is TrialConfig's own."""
    v = bare_off(name, v)
    if name in STR_KNOBS and not isinstance(v, str):
        raise _Bad(
            f"{v!r} is not one of {'|'.join(STR_KNOBS[name])}" + (" (quote it in YAML)" if isinstance(v, bool) else "")
        )
    # Worker-only knobs are checked against a config that has workers, so the condition can't trip.
    extra = {LEADS["workers"]: 1} if name in dependents("workers") else {}
    try:
        TrialConfig(**extra, **{name: v})  # type: ignore[arg-type]  # the value is checked here, on purpose
    except (ConfigError, TypeError) as e:
        raise _Bad(str(e)) from None
    return v
