"""The modules a script imports from its own folder (model.py beside train.py, a package there), followed
from import to import: where a script builds its DataLoader or optimizer outside its own file, as
llama2.c builds its AdamW in model.py and its DataLoader in tinystories.py, the scan still sees them.

Only files under the script's folder count: an installed library's DataLoader or optimizer is not the
script's. Read statically (`ast`), never imported.

May import: the standard library only.
"""

from __future__ import annotations

import ast
from pathlib import Path

MAX_MODULES = 50  # a script folder with more is a project: the first ones found are enough to say what it builds


def local_modules(script: Path, tree: ast.Module) -> list[tuple[Path, ast.Module]]:
    """The modules under `script`'s folder that it imports, directly or through one another, each with its
    syntax tree (a file that cannot be read or parsed is left out: the trial records what ran)."""
    home = script.parent
    seen = {script.resolve()}
    out: list[tuple[Path, ast.Module]] = []
    todo = [tree]
    while todo and len(out) < MAX_MODULES:
        for path in _imported(todo.pop(0), home):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            try:
                module = ast.parse(path.read_text(), str(path))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            out.append((path, module))
            todo.append(module)
    return out


def _imported(tree: ast.Module, home: Path) -> list[Path]:
    """The files under `home` that `tree`'s imports name (`import model`, `from pkg.model import X`,
    `from pkg import model`)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    out = []
    for name in names:
        parts = name.split(".")
        # Importing pkg.model runs pkg/__init__.py first.
        for found in [home.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts) + 1)] + [
            home.joinpath(*parts).with_suffix(".py")
        ]:
            if found.is_file() and found not in out:
                out.append(found)
    return out
