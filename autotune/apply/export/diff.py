"""`export --format diff` of a script study: a unified diff that turns the user's script into the best
configuration measured, for `patch -p0` or `git apply -p0` run from where the export was written.

The diff edits the script's own source where each knob already lives, found through `ast` positions:
  - every `DataLoader(...)` call's num_workers, pin_memory, persistent_workers, prefetch_factor (a
    keyword or the positional argument replaced, or a keyword added);
  - the optimizer constructors' `fused`/`foreach` flags, `zero_grad(set_to_none=...)`;
  - `torch.backends.cudnn.benchmark = True` / `torch.set_num_threads(N)` added after the script's
    imports, where the script sets neither itself (its own line runs after the trial's, so it won);
  - the cooperative calls (autotune.script) whose knob the best config changes become the plain torch
    calls they stand for (at.autocast() -> torch.autocast, at.scaler() -> GradScaler under fp16,
    at.model() -> channels_last / torch.compile), because outside a trial each at.* call is the
    identity: left in place, the patched script run alone would not run what was measured. The calls
    whose knob stays as written are kept, so the script stays tunable for them. at.batch_size() and
    at.accumulation() keep their call and get the measured value as their default; the lr the trial
    scaled for a changed global batch is scaled in the source (at.lr()'s default, else the optimizer's
    lr=) by the same factor.
A trial that is not the baseline overrides every no-edit knob, so each is written where it differs from
what the source says (a literal that already equals it is left alone; an expression is replaced by the
measured value). What cannot be written into the source (a DataLoader given **kwargs, apex) is said in a
comment above the diff, never guessed. A best that is the baseline is one line, "no change".
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.apply.export import _compute, _loader, _step
from autotune.core.config import TrialConfig, baseline_of
from autotune.core.configfile import Export
from autotune.core.errors import ConfigError, PipelineError
from autotune.pipelines import kind_of, script

NO_CHANGE = "# autotune: no change: the fastest configuration measured is {path} as written"


@dataclass(frozen=True)
class Edit:
    """Replace source bytes [start, end) with `text` (start == end: insert)."""

    start: int
    end: int
    text: str


def renders(e: Export) -> bool:
    return "diff" in kind_of(e.config.pipeline).exports


def to_diff(e: Export, device: str | None = None, cwd: str | None = None) -> str:
    cfg = e.config
    if not renders(e):
        raise ConfigError(f"--format diff needs a script study (--pipeline script:...), not {cfg.pipeline!r}")
    path, _ = script.parse(cfg.pipeline)
    try:
        job = script.load(cfg)
    except PipelineError as err:
        raise ConfigError(f"--format diff: the study's script is not readable on this machine: {err}") from None
    if cfg.knobs() == baseline_of(cfg).knobs():
        return NO_CHANGE.format(path=path) + "\n"
    source = Path(path).read_bytes()
    rewrite = Rewrite(source, cfg, job, "cpu" if device in (None, "cpu") else "cuda")
    new = rewrite.apply()
    name, where = header_name(path, cwd or os.getcwd())
    diff = unified(source.decode(), new.decode(), name)
    head = [f"# autotune export for {path}: the best configuration measured, as a change to the script"]
    if e.speedup is not None:
        head.append(f"# measured speedup over the script as written: x{e.speedup:.2f}")
    head += caveats(e)
    head.append(f"# apply it{where}: patch -p0 < <this file>  (or: git apply -p0 <this file>)")
    head += [f"# not in the diff: {note}" for note in rewrite.notes]
    if not diff:
        head.append("# no edit: the source already has every measured value (or was patched already)")
    return "\n".join(head) + "\n" + diff


def caveats(e: Export) -> list[str]:
    """What the diff changes besides speed, said before it is applied: the training math, whether parity
    checked it, and how firm the speedup is."""
    out = []
    math = e.training_math or {}
    if math.get("verdict") == "differs":
        parity = e.parity or {}
        checked = f"; parity: {parity.get('verdict')}" if parity.get("verdict") else ""
        reason = f" ({parity['reason']})" if parity.get("reason") else ""
        out.append(f"# it trains differently: {', '.join(map(str, math.get('changes') or []))}{checked}{reason}")
    if e.confirmed and e.confirmed.get("verdict"):
        out.append(f"# confirmation: {e.confirmed['verdict']}")
    return out


def header_name(path: str, cwd: str) -> tuple[str, str]:
    """The file name the diff's headers give, and where to apply it from: patch and git apply refuse
    absolute names and `..`, so a script outside `cwd` is named from its own folder."""
    rel = os.path.relpath(path, cwd)
    if not rel.startswith(".."):
        return rel, ""
    return Path(path).name, f" from {Path(path).parent}"


def unified(old: str, new: str, name: str) -> str:
    lines = list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), name, name))
    # A last line without a newline gets the marker patch needs to keep it so.
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def lr_argument(call: ast.Call) -> ast.expr | None:
    """An optimizer constructor's lr: its keyword, else its second positional argument."""
    given = next((k.value for k in call.keywords if k.arg == "lr"), None)
    return given if given is not None else call.args[1] if len(call.args) > 1 else None


def same(node: ast.expr, value: Any) -> bool:
    """Whether a literal in the source already says `value` (an expression never does: it is replaced)."""
    try:
        given = ast.literal_eval(node)
    except ValueError:
        return False
    return type(given) is type(value) and given == value


class Rewrite:
    """The edits that make one script's source run `cfg`, and what it could not say in the source."""

    def __init__(self, source: bytes, cfg: TrialConfig, job: script.ScriptJob, device: str) -> None:
        self.source, self.cfg, self.job, self.device = source, cfg, job, device
        self.tree = ast.parse(source)
        self.calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        self.skip = job.unsupported
        self.api_calls = api_calls(self.tree)
        self.base = baseline_of(cfg)
        self.starts = [0]
        for line in source.splitlines(True):
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[Edit] = []
        self.notes: list[str] = []
        self.top: list[str] = []  # lines added after the script's imports
        self.unwritten: dict[ast.Call, list[str]] = {}  # a call given **kwargs -> the keywords it needs

    def apply(self) -> bytes:
        for concept in (_loader, _step, _compute):  # each edits where its knobs live in the source
            concept.edit(self)
        if self.top:
            self.insert_top()
        for call, kwargs in self.unwritten.items():
            self.notes.append(
                f"line {call.lineno}: {callee(call)}(...) takes **kwargs, which may hold them: give it {', '.join(kwargs)}"
            )
        out = self.source
        for edit in sorted(self.edits, key=lambda x: (x.start, x.end), reverse=True):
            out = out[: edit.start] + edit.text.encode() + out[edit.end :]
        return out

    # ---- positions ----------------------------------------------------------------------------
    def at(self, line: int, col: int) -> int:
        """The byte offset of an ast position (col_offset counts UTF-8 bytes)."""
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno or 0, node.end_col_offset or 0)  # type: ignore[attr-defined]

    def replace(self, node: ast.AST, text: str) -> None:
        self.edits.append(Edit(*self.span(node), text))

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end].decode()

    # ---- keywords -----------------------------------------------------------------------------
    def set_keyword(self, call: ast.Call, name: str, value: Any, default: Any, position: int | None = None) -> None:
        """Make `call` pass `name=value`: its keyword or positional argument replaced when it differs, or
        the keyword added when the default it runs with differs."""
        given: ast.expr | None = next((k.value for k in call.keywords if k.arg == name), None)
        if given is None and position is not None and len(call.args) > position:
            if not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
                given = call.args[position]
        if given is not None:
            if not same(given, value):
                self.replace(given, repr(value))
            return
        if value == default:
            return
        if any(k.arg is None for k in call.keywords):
            # The keyword may already be in the mapping: adding it could pass it twice (a TypeError).
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

    def default(self, call: ast.Call, value: int) -> None:
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
        if arg is None:
            offset = self.span(call)[1] - 1
            self.edits.append(Edit(offset, offset, repr(value)))
        else:
            self.replace(arg, repr(value))

    # ---- what the concept modules read --------------------------------------------------------
    def calls_to(self, *names: str) -> list[ast.Call]:
        """The source's calls of functions or methods with one of these names, in ast.walk order."""
        return [c for c in self.calls if callee(c) in names]

    def api(self, name: str) -> list[ast.Call]:
        """The source's calls of autotune.script's `name` (at.model, at.autocast, ...)."""
        return [call for n, call in self.api_calls if n == name]

    callee = staticmethod(callee)
    same = staticmethod(same)
    lr_argument = staticmethod(lr_argument)

    def insert_top(self) -> None:
        """The added lines go after the script's leading imports, with `import torch` if it has none."""
        body = self.tree.body
        imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        if not any(
            isinstance(n, ast.Import) and any(a.name == "torch" and not a.asname for a in n.names) for n in imports
        ):
            self.top.insert(0, "import torch")
        lead = imports[-1] if imports else None
        offset = self.starts[lead.end_lineno] if lead is not None and lead.end_lineno is not None else 0
        if offset == len(self.source) and not self.source.endswith(b"\n"):
            self.top[0] = "\n" + self.top[0]
        self.edits.append(Edit(offset, offset, "".join(line + "\n" for line in self.top)))


def api_calls(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """Each call into autotune.script in the source, with the API function it calls (the aliases
    autotune.pipelines.script.scan accepts)."""
    aliases: set[str] = set()
    direct: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "autotune":
            aliases |= {a.asname or a.name for a in node.names if a.name == "script"}
        elif isinstance(node, ast.ImportFrom) and node.module == script.API_MODULE:
            direct |= {a.asname or a.name: a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == script.API_MODULE and a.asname}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            out.append((f.attr, node))
        elif isinstance(f, ast.Attribute) and ast.unparse(f.value) == script.API_MODULE:
            out.append((f.attr, node))
        elif isinstance(f, ast.Name) and f.id in direct:
            out.append((direct[f.id], node))
    return out
