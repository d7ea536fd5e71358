"""core/outcomes.py: one vocabulary for roles, reasons and verdicts. The words are the ones studies have
always stored; a member is its word wherever it goes (compared, formatted, JSON, YAML); and no other
module spells one of them as a literal where it means a role, a reason or a verdict."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from autotune.core.outcomes import Reason, Role, Verdict

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"
WORDS = {str(m.value) for e in (Role, Reason, Verdict) for m in e}
CONTEXT = ("role", "reason", "verdict", "status")  # the names under which these words travel


def test_the_stored_words_are_unchanged() -> None:
    """Stored studies stay readable: the values are the strings written before the enums existed."""
    assert {m.value for m in Role} == {"baseline", "warm_start", "search"}
    assert {m.value for m in Verdict} == {"pass", "fail", "not checked", "skipped"}
    assert {"oom", "numerics", "unsupported", "timeout", "crash", "comm", "bad_config", "data", "pruned"} <= {
        m.value for m in Reason
    }


@pytest.mark.parametrize("word", [Role.BASELINE, Reason.OOM, Verdict.NOT_CHECKED])
def test_a_member_is_its_word_wherever_it_goes(word: Role | Reason | Verdict) -> None:
    plain = str(word.value)
    assert word == plain and hash(word) == hash(plain) and {plain: 1}[word] == 1
    assert f"{word}" == str(word) == plain and f"{word:>12}" == f"{plain:>12}"
    assert json.loads(json.dumps({"k": word})) == {"k": plain}
    assert yaml.safe_load(yaml.safe_dump({"k": word})) == {"k": plain}


def _is_word(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in WORDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_word(e) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _is_word(node.body) or _is_word(node.orelse)
    return False


def _in_context(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return any(word in text for word in CONTEXT)


def literal_words(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place a role, reason or verdict is spelled as a string literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            hit = any(_is_word(s) for s in sides) and any(_in_context(s) for s in sides if not _is_word(s))
        elif isinstance(node, ast.keyword):
            hit = node.arg in CONTEXT and _is_word(node.value)
        elif isinstance(node, ast.Dict):
            hit = any(
                isinstance(k, ast.Constant) and k.value in CONTEXT and _is_word(v)
                for k, v in zip(node.keys, node.values)
            )
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hit = node.value is not None and _is_word(node.value) and any(_in_context(t) for t in targets)
        elif isinstance(node, ast.Call):
            hit = _in_context(node.func) and any(_is_word(a) for a in node.args)
        if hit:
            found.append((getattr(node, "lineno", 0), ast.unparse(node)[:100]))
    return found


def test_the_checker_finds_each_kind_of_literal() -> None:
    bad = """
if record.role == "baseline": pass
write(TrialRecord(role="search", reason="headroom"))
v = {"verdict": "pass" if ok else "fail"}
ok = [t for t in ts if verdict(t) not in ("fail", "skipped")]
class TrialOOM(TrialFailure):
    reason = "oom"
write_reason(trial, "interrupted")
"""
    assert len(literal_words(bad)) == 7, literal_words(bad)
    fine = 'if args.command == "search": pass\nname = "data"\nroles.index(Role.BASELINE)\n'
    assert literal_words(fine) == []


def test_no_module_spells_a_role_reason_or_verdict_as_a_literal() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "outcomes.py" or path.parent.name != "core"
        if (hits := literal_words(path.read_text()))
    }
    assert not offenders, offenders
