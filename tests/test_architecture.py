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
    """search/store/records/ spells every user-attr key once; a raw `user_attrs` read or `set_user_attr` write
    elsewhere would spell one again (and give a missing one another default)."""
    own = PACKAGE / "search" / "store" / "records"
    raw = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if own not in p.parents and ("user_attrs" in p.read_text() or "set_user_attr" in p.read_text())
    )
    assert (own / "__init__.py").is_file() and raw == [], raw


def test_only_the_run_holds_the_seams_every_record_reads_what_the_run_showed() -> None:
    """The seams fill one record of what the run showed (trial/loop/script/shown.py); the parts that turn it
    into each knob's record (batch, loader, optimizer, records) and the knobs' torch side never import the
    seams, not even for a type: the one module that runs the script hands `seams.shown()` over."""
    trial_loop = PACKAGE / "trial" / "loop"
    importers = sorted(
        str(p.relative_to(PACKAGE))
        for p in trial_loop.rglob("*.py")
        if any(
            isinstance(node, ast.ImportFrom) and node.module == "autotune.trial.loop.script.seams"
            for node in ast.walk(ast.parse(p.read_text()))
        )
    )
    assert importers == ["trial/loop/script/running.py"], importers


# The knob table (core/config.py), the knob list's modules (core/knobs/), the worker code that applies the knobs: pipelines/, trial/, and
# autotune.script, the cooperative calls (at.batch_size(), ...) through which a trial applies them to a script.
APPLIERS = ("core/config.py", "core/knobs/", "pipelines/", "trial/", "script/")


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


# The prefixes a pipeline spec's kind is written with; autotune/pipelines/kind.py reads them, once.
KIND_PREFIXES = ("script:", "lightning:", "hf:")
KIND_TESTS = frozenset({"is_script", "is_framework"})


def _prefix_tests(tree: ast.AST) -> list[str]:
    """Where a module tells a spec's kind by itself: a call or import of is_script/is_framework, a
    startswith/removeprefix against a kind's prefix, or the bare prefix as a string (len('script:'),
    == 'hf:', ...). What it should do instead is ask `kind_of(spec)`."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and KIND_TESTS & {a.name for a in node.names}:
            found.append(f"{line}: imports {', '.join(sorted(KIND_TESTS & {a.name for a in node.names}))}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in KIND_TESTS:
                found.append(f"{line}: calls {name}")
            elif name in ("startswith", "removeprefix") and node.args:
                arg = node.args[0]
                said = [arg] if isinstance(arg, ast.Constant) else list(getattr(arg, "elts", []))
                if any(isinstance(c, ast.Constant) and str(c.value).startswith(KIND_PREFIXES) for c in said):
                    found.append(f"{line}: {name}({ast.unparse(arg)})")
        elif isinstance(node, ast.Constant) and node.value in KIND_PREFIXES:
            found.append(f"{line}: spells {node.value!r}")
    return found


def test_the_prefix_scan_finds_each_way_of_testing_a_spec_by_hand() -> None:
    source = "\n".join(
        [
            "from autotune.pipelines.script import is_script",
            "a = is_script(spec)",
            "b = frameworks.is_framework(spec)",
            "c = spec.startswith('script:')",
            "d = spec.startswith(('lightning:', 'hf:'))",
            "e = spec[len('script:') :]",
            "f = kind_of(spec).can_probe_memory",
            "g = '--pipeline script:PATH ARGS'",  # a help text names the spec's form: no test of a spec
        ]
    )
    lines = {int(f.split(": ")[0]) for f in _prefix_tests(ast.parse(source))}
    assert sorted(lines) == [1, 2, 3, 4, 5, 6], _prefix_tests(ast.parse(source))


def test_no_module_outside_pipelines_tests_a_specs_prefix() -> None:
    """The kind of job is an object (autotune.pipelines.kind): whose loop runs, whether the model can be
    probed or drawn once, its ceiling, its exports, what it preloads, the command that runs it alone. A
    module elsewhere that reads the prefix itself spreads that knowledge again."""
    found = {
        str(p.relative_to(PACKAGE)): hits
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).parts[0] != "pipelines" and (hits := _prefix_tests(ast.parse(p.read_text())))
    }
    assert found == {}, "\n".join(f"autotune/{m}:{h}" for m, hits in found.items() for h in hits)
