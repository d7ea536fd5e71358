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
