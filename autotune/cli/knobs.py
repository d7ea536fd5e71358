"""`knobs`: what a search tunes, read from each knob's declaration and a search space."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli._common import new_console
from autotune.search.space import table
from autotune.search.space.reading import load_space
from autotune.search.space.spec import DEFAULT_SPACE


def register(sub: Any) -> None:
    k = sub.add_parser(
        "knobs",
        help="list the knobs a search tunes",
        description="List every knob autotune tunes: what it sets, its default (the plain PyTorch baseline), "
        "the values the search space gives it, and whether it can change the training computed (then a "
        "trial is checked before it can win).",
    )
    k.add_argument("--space", default=None, metavar="FILE", help="search-space YAML (default: the default space)")
    k.add_argument("--markdown", action="store_true", help="print a Markdown table (README's)")
    k.set_defaults(func=cmd_knobs)


def cmd_knobs(args: argparse.Namespace) -> int:
    space = load_space(args.space or DEFAULT_SPACE)
    if args.markdown:
        print(table.markdown(space), end="")
        return 0
    from rich.table import Table  # lazy: rich, not loaded for `autotune --help`

    t = Table(*table.HEADER, title=f"knobs ({args.space or 'default space'})")
    for row in table.rows(space):
        t.add_row(*(cell.replace("`", "") for cell in row))
    new_console().print(t)
    return 0
