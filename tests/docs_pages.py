"""The user docs as the tests read them: README.md and docs/*.md, their code blocks exactly as a reader
copies them, their headings' anchors and their relative links. A test that runs an example takes it
from the page where the example lives, through `code_blocks`, the one parser of fenced blocks."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import unquote

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") and ![alt](target); the text may hold inline code but no closing bracket.
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def pages() -> list[Path]:
    """Every page a user reads: the README and docs/ (subfolders included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def code_blocks(page: Path, lang: str) -> list[str]:
    """The fenced ```<lang> blocks of `page`, each as its text between the fences."""
    return re.findall(rf"^```{re.escape(lang)}\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def python_block(page: Path, marker: str) -> str:
    """The one ```python block of `page` that contains `marker` (an example's `# file.py` first line)."""
    found = [b for b in code_blocks(page, "python") if marker in b]
    assert len(found) == 1, f"{page.name} has {len(found)} python blocks containing {marker!r}"
    return found[0]


def autotune_commands(page: Path, marker: str) -> list[list[str]]:
    """The `autotune ...` lines of the one ```bash block of `page` that contains `marker`, as argument
    lists without the leading `autotune` (comments dropped)."""
    found = [b for b in code_blocks(page, "bash") if marker in b]
    assert len(found) == 1, f"{page.name} has {len(found)} bash blocks containing {marker!r}"
    lines = found[0].splitlines()
    return [shlex.split(line.split("#")[0])[1:] for line in lines if line.startswith("autotune ")]


def _prose_lines(text: str) -> list[str]:
    """The page's lines with fenced blocks blanked (line numbers kept): links and headings live outside code."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercased, with every character but letters,
    digits, underscores, hyphens and spaces removed, and each space turned into a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list[tuple[int, str]]:
    """(level, text) of each ATX heading outside code, in page order."""
    found = [_HEADING.match(line) for line in _prose_lines(page.read_text())]
    return [(len(m.group(1)), m.group(2)) for m in found if m]


def anchors(page: Path) -> set[str]:
    """The anchors of the page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, text in headings(page):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and reference definition outside code."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(_prose_lines(page.read_text()), 1):
        line = re.sub(r"(`+).*?\1", "``", line)  # inline code is not a link
        found += [(number, target) for target in _INLINE_LINK.findall(line)]
        m = _REFERENCE_DEF.match(line)
        if m:
            found.append((number, m.group(1)))
    return found


def broken_links(checked: list[Path], root: Path = REPO_ROOT) -> list[str]:
    """`page:line: target: why` for each relative link among `checked` whose file does not exist (or
    lies outside `root`), or whose #anchor names no heading of its Markdown target. Links with a
    scheme (https:, mailto:) are left to the reader."""
    broken: list[str] = []
    for page in checked:
        for number, target in links(page):
            if _SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path)).resolve() if path else page.resolve()
            where = f"{page.resolve().relative_to(root.resolve())}:{number}: {target}"
            if not target:
                broken.append(f"{where}: empty link")
            elif not dest.is_relative_to(root.resolve()):
                broken.append(f"{where}: outside the repository")
            elif not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix != ".md":
                broken.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with this anchor in {dest.relative_to(root.resolve())}")
    return broken
