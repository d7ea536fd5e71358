"""Where the user's script builds each DataLoader and optimizer (file, line, columns), what it gave the
knobs there and what ran: the sites `export --format diff` edits.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch


def record_site(
    sites: dict[str, list[dict[str, Any]]], kind: str, obj: Any, own: dict[str, Any], ran: Any, **used: bool
) -> dict[str, Any]:
    """The record, in `sites[kind]`, of the user's call that built `obj` (one per call, however often it runs:
    a loader built each epoch is one site, iterated if any of its loaders was)."""
    where = call_site()
    for site in sites[kind]:
        if all(site.get(k) == v for k, v in where.items()):
            return site
    site = where | {"type": type(obj).__name__, "own": plain(own), "ran": plain(ran), **used}
    sites[kind].append(site)
    return site


def call_site() -> dict[str, Any]:
    """The user's call that is constructing a DataLoader or optimizer: the first frame out of torch and
    autotune (a subclass's own __init__ is the user's), its file and line, and the call's columns where
    Python says them (3.11+: the instruction's position); where that is not the script's own file (a module
    beside it, a library's factory), also `via`: the script's own call that led there, where the diff can
    reach an option it passes."""
    inside = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (torch, sys.modules["autotune"]))
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(inside):
        frame = frame.f_back
    where = _position(frame)
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    via = frame.f_back
    while where["file"] != script and via is not None and os.path.abspath(via.f_code.co_filename) != script:
        via = via.f_back
    if where["file"] != script and via is not None:  # built in a library: the script's own call into it
        where["via"] = _position(via)
    return where


def _position(frame: Any) -> dict[str, Any]:
    """A frame's file and line, and the columns of the call it is making where Python says them."""
    where: dict[str, Any] = {"file": os.path.abspath(frame.f_code.co_filename), "line": frame.f_lineno}
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None:
        line, end_line, col, end_col = list(positions())[frame.f_lasti // 2]
        if line == frame.f_lineno and None not in (end_line, col, end_col):
            where |= {"col": col, "end_line": end_line, "end_col": end_col}
    return where


def plain(value: Any) -> Any:
    """A recorded argument as the study stores it (JSON): a number, a word or None, else its repr."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)
