"""The package's shape is part of its contract: layers that import only downwards, small modules,
and a docstring per subpackage saying what it owns and may import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autotune"
LAYERS = ("core", "pipelines", "trial", "search", "apply", "cli")


def test_import_linter_contracts_hold() -> None:
    from importlinter.cli import lint_imports

    # The contracts live in pyproject.toml; a backwards import (say, autotune.trial importing optuna or
    # autotune.search importing autotune.apply) makes this fail and prints which import broke which rule.
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_contracts_name_every_layer() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for layer in LAYERS:
        assert f'"autotune.{layer}"' in text, f"autotune.{layer} is not in the layers contract"


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_says_what_it_owns_and_may_import(layer: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc and "May import" in doc, f"autotune/{layer}/__init__.py needs a docstring with 'May import:'"


def test_the_package_is_layered_not_flat() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert flat == [], f"modules outside a layer: {flat}"


def test_study_attrs_are_read_and_written_only_through_the_records() -> None:
    """search/store/records.py spells every user-attr key once; a raw `user_attrs` read or `set_user_attr` write
    elsewhere would spell one again (and give a missing one another default)."""
    own = PACKAGE / "search" / "store" / "records.py"
    raw = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p != own and ("user_attrs" in p.read_text() or "set_user_attr" in p.read_text())
    )
    assert own.is_file() and raw == [], raw


# The knob table (core/config.py) and the worker code that applies the knobs: pipelines/, trial/, and
# autotune.script, the cooperative calls (at.batch_size(), ...) through which a trial applies them to a script.
APPLIERS = ("core/config.py", "pipelines/", "trial/", "script/")


def _spellings(tree: ast.AST, knobs: frozenset[str]) -> set[str]:
    """The knobs a module spells out: as a string (a key, a column, a YAML field) or a keyword argument. A
    read of `cfg.<knob>` is not one: mypy ties it to TrialConfig's one declaration, so a renamed or
    dropped knob fails the type check there, where a string would drift silently."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in knobs:
            out.add(node.value)
        elif isinstance(node, ast.keyword) and node.arg in knobs:
            out.add(node.arg)
    return out


def test_each_knob_is_spelled_in_at_most_three_modules_besides_its_table_and_appliers() -> None:
    """One declaration per knob: the modules that spell a knob out are the ones that decide something about
    that knob in particular (its narrowing on this hardware, its rendering in the exports, the guides'
    first guess); everything else reads the table."""
    from autotune.core.config import KNOBS

    where: dict[str, list[str]] = {k: [] for k in KNOBS}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith(APPLIERS):
            continue
        for knob in _spellings(ast.parse(path.read_text()), frozenset(KNOBS)):
            where[knob].append(rel)
    over = {k: mods for k, mods in where.items() if len(mods) > 3}
    assert not over, "\n".join(f"{k}: {len(m)} modules: {', '.join(m)}" for k, m in over.items())
