"""One file of a diff: its bytes, its syntax tree and the byte offsets of its lines, the edits made to it
(replace or insert at `ast` positions: col_offset counts UTF-8 bytes), and the keywords a call given
**mappings needs. Rewrite (diff.py) decides what to edit; this module knows how an edit lands.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from autotune.pipelines.script.source import argparse_option


@dataclass(frozen=True)
class Edit:
    """Replace source bytes [start, end) with `text` (start == end: insert)."""

    start: int
    end: int
    text: str


def callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def same(node: ast.expr, value: Any) -> bool:
    """Whether a literal in the source already says `value` (an expression never does: it is replaced)."""
    try:
        given = ast.literal_eval(node)
    except ValueError:
        return False
    return type(given) is type(value) and given == value


UNKNOWN = object()  # a value the source computes at run time, which the diff cannot read


class Source:
    """One file of the diff: its bytes, tree and line offsets, the edits made to it, and the keywords a
    call given **kwargs needs (said, not written). `name` is how the diff names it (relative to where it
    is applied); `editable` is False for a file outside that folder, whose edits are said as lines."""

    def __init__(self, path: str, name: str, source: bytes, editable: bool = True) -> None:
        self.path, self.name, self.source, self.editable = path, name, source, editable
        self.tree = ast.parse(source)
        self.calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        self.starts = [0]
        for line in source.splitlines(True):
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[Edit] = []
        self.merged: dict[ast.Call, dict[str, Any]] = {}  # a call given one **mapping -> the keywords over it
        self.unwritten: dict[ast.Call, list[str]] = {}  # a call given several -> the keywords it needs

    def where(self, node: ast.AST, main: bool) -> str:
        """A line as a note names it: `line N` in the script, `file:N` elsewhere."""
        line = getattr(node, "lineno", 0)
        return f"line {line}" if main else f"{self.name}:{line}"

    def patched(self) -> bytes:
        out = self.source
        for edit in sorted(dict.fromkeys(self.edits), key=lambda x: (x.start, x.end), reverse=True):
            out = out[: edit.start] + edit.text.encode() + out[edit.end :]
        return out

    # ---- positions ----------------------------------------------------------------------------
    def at(self, line: int, col: int) -> int:
        """The byte offset of an ast position (col_offset counts UTF-8 bytes)."""
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno or 0, node.end_col_offset or 0)  # type: ignore[attr-defined]

    def replace(self, node: ast.AST, text: str) -> None:
        edit = Edit(*self.span(node), text)
        if edit not in self.edits:  # two sites may share one argparse option's default
            self.edits.append(edit)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end].decode()

    def call_at(self, site: Mapping[str, Any]) -> ast.Call | None:
        """The call a trial recorded at `site`: the one at its exact columns where Python said them, else the
        one starting on its line that names the class it built (or the only one starting there)."""
        line = site.get("line")
        if "col" in site:
            for call in self.calls:
                if (call.lineno, call.col_offset, call.end_lineno, call.end_col_offset) == (
                    line,
                    site["col"],
                    site.get("end_line"),
                    site.get("end_col"),
                ):
                    return call
        starting = [c for c in self.calls if c.lineno == line]
        named = [c for c in starting if callee(c) == site.get("type")]
        return named[0] if len(named) == 1 else starting[0] if len(starting) == 1 else None

    def argument(self, call: ast.Call, name: str, position: int | None) -> ast.expr | None:
        """What `call` passes as `name`: its keyword, else its positional argument at `position`."""
        given: ast.expr | None = next((k.value for k in call.keywords if k.arg == name), None)
        if given is None and position is not None and len(call.args) > position:
            if not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
                given = call.args[position]
        return given

    def add_keyword(self, call: ast.Call, name: str, value: Any) -> None:
        spreads = [k for k in call.keywords if k.arg is None]
        # The keyword may already be in a mapping: added beside it, it could be passed twice (a TypeError).
        # Merged over the one mapping, it wins whatever the mapping holds; with several, it is said.
        if len(spreads) == 1:
            self.merged.setdefault(call, {})[name] = value
            return
        if spreads:
            self.unwritten.setdefault(call, []).append(f"{name}={value!r}")
            return
        args: list[ast.AST] = [*call.args, *call.keywords]
        if args:
            last = max(args, key=lambda a: (a.end_lineno, a.end_col_offset))  # type: ignore[attr-defined]
            offset = self.span(last)[1]
            self.edits.append(Edit(offset, offset, f", {name}={value!r}"))
        else:
            offset = self.span(call)[1] - 1  # before its closing parenthesis
            self.edits.append(Edit(offset, offset, f"{name}={value!r}"))

    def merge_spreads(self, main: bool) -> list[str]:
        """Write the keywords over each call's one **mapping (`**{**kw, 'num_workers': 2}`); the notes
        that say so."""
        notes = []
        for call, keywords in self.merged.items():
            spread = next(k.value for k in call.keywords if k.arg is None)
            bare = isinstance(spread, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
            mapping = self.text(spread) if bare else f"({self.text(spread)})"
            items = ", ".join(f"{k!r}: {v!r}" for k, v in keywords.items())
            self.replace(spread, f"{{**{mapping}, {items}}}")
            said = ", ".join(f"{k}={v!r}" for k, v in keywords.items())
            verb = "is" if len(keywords) == 1 else "are"
            notes.append(
                f"{self.where(call, main)}: {callee(call)}(...) takes **{self.text(spread)}: the measured {said} "
                f"{verb} merged over it, so what ran holds whatever it carries"
            )
        return notes

    def option(self, node: ast.expr) -> tuple[ast.Call, list[str]] | None:
        """The argparse option `node` reads (`args.workers`): its add_argument call in this file and its
        flags; None for anything else."""
        if not isinstance(node, ast.Attribute):
            return None
        for call in self.calls:
            option = argparse_option(call)
            if option is not None and option[0] == node.attr and any(f.startswith("-") for f in option[1]):
                return call, option[1]
        return None


def literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


def parsed(word: str, like: Any) -> Any:
    """An option's word from the command line, as its default's type (an int default reads an int)."""
    try:
        return type(like)(word) if isinstance(like, (int, float)) and not isinstance(like, bool) else int(word)
    except ValueError:
        return UNKNOWN


def with_keywords(call: ast.Call, kwargs: list[str]) -> ast.Call:
    """`call` with `name=value` keywords added before its **mapping: the line a note says to write."""
    added = [ast.keyword(arg=k, value=ast.parse(v, mode="eval").body) for k, v in (kw.split("=", 1) for kw in kwargs)]
    plain = [k for k in call.keywords if k.arg is not None]
    spread = [k for k in call.keywords if k.arg is None]
    return ast.Call(func=call.func, args=call.args, keywords=[*plain, *added, *spread])


def said_as_lines(src: Source) -> list[str]:
    """The edits to a file outside the folder the diff is applied from, said as the lines to write."""
    old, new = src.source.decode().splitlines(), src.patched().decode().splitlines()
    out = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            lines = " / ".join(line.strip() for line in new[j1:j2])
            out.append(f"{src.path}:{i1 + 1}: write {lines}")
    return out
