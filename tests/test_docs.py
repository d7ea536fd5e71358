"""The user docs hold together: every relative link and anchor resolves, mkdocs' nav lists every page,
the README keeps the commands users and CI type and a knob table that is the default space, and the
pipeline example is the file it names. The examples that run are run by the tests of what they show
(tests/pipelines/test_lightning.py, test_hf.py, tests/apply/test_export_frameworks.py), from their pages."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import yaml

from tests.conftest import REPO_ROOT
from tests.docs_pages import DOCS, README, broken_links, headings, pages, python_block, slug


def test_every_relative_link_and_anchor_resolves() -> None:
    assert broken_links(pages()) == []


def test_the_link_checker_reports_each_broken_link_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "b.md").write_text("# B page\n\n## Twice\n\n## Twice\n\n## `fsdp_reshard`: why\n")
    page = tmp_path / "docs" / "a.md"
    lines = [
        "# A page",
        "Good: [b](b.md), [b's heading](b.md#twice-1), [knob](b.md#fsdp_reshard-why), [here](#a-page),",
        "[code](../code.py), [a folder](.), [site](https://example.org/missing.md#x).",
        "Broken: [gone](missing.md), [no anchor](b.md#thrice), [no local](#nowhere),",
        "[anchor in code](../code.py#L1), [escape](../../outside.md)",
        "[ref]: gone-too.md",
        "```bash",
        "[in a block](also-missing.md)",
        "```",
        "Inline code is no link: `[x](not-a-link.md)`.",
    ]
    page.write_text("\n".join(lines) + "\n")
    found = broken_links([page], root=tmp_path)
    assert [f.split(": ")[1] for f in found] == [
        "missing.md",
        "b.md#thrice",
        "#nowhere",
        "../code.py#L1",
        "../../outside.md",
        "gone-too.md",
    ], found
    assert [f.split(": ")[0] for f in found] == ["docs/a.md:4"] * 3 + ["docs/a.md:5"] * 2 + ["docs/a.md:6"]
    assert "no such file" in found[0] and "no heading" in found[1] and "outside the repository" in found[4]


def test_slugs_follow_githubs_rule() -> None:
    assert slug("Strategies: DDP and FSDP") == "strategies-ddp-and-fsdp"
    assert slug("Two speedups: samples/s and time to target") == "two-speedups-sampless-and-time-to-target"
    assert slug("Real epochs: `train --compare-baseline`") == "real-epochs-train---compare-baseline"
    assert slug("[Linked](x.md) `num_workers` (default 0)") == "linked-num_workers-default-0"


def test_mkdocs_nav_is_every_docs_page() -> None:
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())
    nav = [next(iter(entry.values())) for entry in config["nav"]]
    assert (REPO_ROOT / config["docs_dir"]).resolve() == DOCS.resolve()
    assert sorted(nav) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert len(nav) == len(set(nav)) and nav[0] == "index.md"


def test_readme_keeps_the_commands_users_and_ci_type() -> None:
    lines = README.read_text().splitlines()
    # .ci/run runs `./launch.sh test`: the README's test command must be exactly that.
    assert "./launch.sh search --budget 10m   # set up on first use, then search on built-in defaults" in lines
    assert "./launch.sh test                  # run the test suite" in lines
    text = "\n".join(lines)
    assert "autotune search --budget 2h" in text and "optuna-dashboard studies.db" in text


def test_readme_knob_table_is_the_default_space() -> None:
    text = README.read_text()
    section = text.split("## What it searches", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in re.findall(r"`([a-z0-9_*]+)`", row)]
    space = yaml.safe_load((REPO_ROOT / "search_spaces" / "default.yaml").read_text())["knobs"]
    assert sorted(k for k in space if any(fnmatch.fnmatchcase(k, n) for n in named)) == sorted(space)
    assert all(any(fnmatch.fnmatchcase(k, n) for k in space) for n in named), named


def test_the_pipeline_example_is_the_file_it_names() -> None:
    """The protocol's complete example is tests/external_pipeline/my_pipeline.py (which the install test
    searches with): the same code, comments and layout aside."""
    block = python_block(DOCS / "own-model.md", "--pipeline my_pipeline:make")
    shipped = ast.parse((REPO_ROOT / "tests" / "external_pipeline" / "my_pipeline.py").read_text())
    shipped.body = shipped.body[1:]  # its module docstring
    assert ast.dump(ast.parse(block)) == ast.dump(shipped)


def test_every_page_opens_with_its_one_title() -> None:
    for page in pages():
        found = headings(page)
        assert found and found[0][0] == 1 and [level for level, _ in found].count(1) == 1, (page, found[:3])
