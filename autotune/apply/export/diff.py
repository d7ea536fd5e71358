"""`export --format diff` of a script study: a unified diff that turns the user's script into the best
configuration measured, for `patch -p0` or `git apply -p0` run from where the export was written.

It holds exactly what was measured. The trial records where the script built each DataLoader and
optimizer (the user's call: file, line, columns), what it gave the knobs there, what ran, and whether the
trial iterated or stepped it (Export.sites); the diff edits those calls only, found through `ast`
positions, and in them only the knobs whose measured value differs from the script's own:
  - the iterated loaders' num_workers, pin_memory, persistent_workers, prefetch_factor (a keyword or the
    positional argument replaced, or a keyword added); a value read from an argparse option
    (`num_workers=args.workers`) through the option's default, so the script's own flag keeps working;
  - the stepped optimizers' `fused`/`foreach` flags, in the script or in a module it imports (a second
    file of the diff, named from where it is applied); `zero_grad(set_to_none=...)`;
  - the process flags of the knob list (`torch.backends.cudnn.benchmark = True`, TF32's) and
    `torch.set_num_threads(N)` added after the script's imports, where the script sets none itself (its
    own line runs after the trial's, so it won);
  - the cooperative calls (autotune.script) whose knob the best config changes become the plain torch
    calls they stand for (at.autocast() -> torch.autocast, at.scaler() -> GradScaler under fp16,
    at.model() -> the memory format / torch.compile: each knob's module says its call), because outside a trial each at.* call is the
    identity: left in place, the patched script run alone would not run what was measured. The calls
    whose knob stays as written are kept, so the script stays tunable for them. at.batch_size() and
    at.accumulation() keep their call and get the measured value as their default; the lr the trial
    scaled for a changed global batch is scaled in the source (at.lr()'s default, else the optimizer's
    lr=) by the same factor;
  - an unedited script's model knobs (the knob list's, in its order: each module's LINES) as plain torch
    lines after the statement that builds the stepped optimizer from MODEL.parameters(), where MODEL is
    assigned once an instance of the class the trials found (_compute._model_lines).
A knob that does nothing on the machine measured (pin_memory, cudnn_benchmark without CUDA: the search
fixes them there, unsearched) is never written. A call given one **mapping gets the measured keywords
merged over it (`**{**kw, 'num_workers': 2}`: added beside it, a keyword it holds would be passed twice).
What cannot be written (a call given several **mappings, a value computed at run time, a file outside
the folder the diff is applied from, apex) is said in a comment above the diff with the file, line and
what to write there, never guessed. A study without sites (made
before they were recorded) has every DataLoader and fusable optimizer call in the script edited, said.
A best that is the baseline is an empty diff (NO_CHANGE): `patch -p0` applies it as nothing, where a
comment alone would be "Only garbage" to it (`--format script` says "no change").
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from autotune.apply.export import _compute, _loader, _step
from autotune.apply.export._source import (
    UNKNOWN,
    Edit,
    Source,
    callee,
    literal,
    parsed,
    said_as_lines,
    same,
    with_keywords,
)
from autotune.core.config import TrialConfig, baseline_of
from autotune.core.configfile import Export
from autotune.core.errors import ConfigError, PipelineError
from autotune.pipelines import kind_of, script
from autotune.search.space.resolve import NO_EFFECT_WITHOUT_CUDA

# The export of a best that is the baseline: nothing to apply. Empty, because patch reads a file of
# comments alone as "Only garbage was found in the patch input" (exit 2), and an empty one as no change.
NO_CHANGE = ""


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
    if cfg.is_baseline:
        return NO_CHANGE
    source = Path(path).read_bytes()
    name, where = header_name(path, cwd or os.getcwd())
    home = str(Path(path).parent) if where else cwd or os.getcwd()
    rewrite = Rewrite.measured(source, cfg, job, device, e.sites, home)
    new = rewrite.apply()
    diff = unified(source.decode(), new.decode(), name)
    for other in rewrite.others():  # a module where the script builds a loader or optimizer it ran
        diff += unified(other.source.decode(), other.patched().decode(), other.name)
    head = [f"# autotune export for {path}: the best configuration measured, as a change to the script"]
    if e.speedup is not None:
        head.append(f"# measured speedup over the script as written: x{e.speedup:.2f}")
    head += caveats(e)
    head.append(f"# apply it{where}: patch -p0 < <this file>  (or: git apply -p0 <this file>)")
    head += [f"# {note}" for note in rewrite.merged_notes]
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


def lr_argument(call: ast.Call) -> ast.expr | None:
    """An optimizer constructor's lr: its keyword, else its second positional argument."""
    given = next((k.value for k in call.keywords if k.arg == "lr"), None)
    return given if given is not None else call.args[1] if len(call.args) > 1 else None


class Rewrite(Source):
    """The edits that make one script (and the modules where it builds its loaders and optimizers) run
    `cfg`, and what it could not say in the source.

    sites: the DataLoader and optimizer construction sites the best trial recorded (Export.sites); None:
    the study has none, and every DataLoader and fusable optimizer call in the script is edited.
    home: the folder the diff is applied from; a file outside it is not edited, its lines are said."""

    def __init__(
        self,
        source: bytes,
        cfg: TrialConfig,
        job: script.ScriptJob,
        device: str,
        sites: Mapping[str, Any] | None = None,
        home: str | None = None,
        measured_on: str | None = None,
    ) -> None:
        self.home = home or str(Path(job.path).parent)
        super().__init__(job.path, self.name_of(job.path), source)
        self.cfg, self.job, self.device, self.recorded = cfg, job, device, sites
        self.skip = job.unsupported
        self.api_calls = api_calls(self.tree)
        self.base = baseline_of(cfg)
        self.notes: list[str] = []  # what the diff could not write
        # Each option whose default the diff changed while the study's arguments give it (its flags ->
        # value): the script runs the change only with those arguments changed too, as the notes advise.
        self.flags: dict[tuple[str, ...], Any] = {}
        self.merged_notes: list[str] = []  # the keywords written over a call's **mapping
        self.top: list[str] = []  # lines added after the script's imports
        self.model_written: list[str] = []  # the model knobs written as torch lines (_compute._model_lines)
        self.files: dict[str, Source | None] = {os.path.realpath(job.path): self}
        # What does nothing where the best was measured (a device the Export does not name: unknown).
        cpu = measured_on is not None and measured_on.startswith("cpu")
        self.no_effect = frozenset(NO_EFFECT_WITHOUT_CUDA if cpu else ())

    @classmethod
    def measured(
        cls,
        source: bytes,
        cfg: TrialConfig,
        job: script.ScriptJob,
        device: str | None,
        sites: Mapping[str, Any] | None,
        home: str | None = None,
    ) -> Rewrite:
        """The rewrite of `cfg` as measured on `device` (the Export's): the diff's, and the copy the alone
        rounds run (apply/export/patched.py), so the copy holds exactly the diff."""
        on = "cpu" if device in (None, "cpu") else "cuda"
        return cls(source, cfg, job, on, sites=sites, home=home, measured_on=device)

    def name_of(self, path: str) -> str:
        return os.path.relpath(path, self.home)

    def apply(self) -> bytes:
        if self.recorded is None:
            self.notes.append(
                "the study recorded no DataLoader or optimizer sites (made before autotune recorded them): "
                "every DataLoader and optimizer call in the script is edited, iterated or not, and one built "
                "in another module is not reached"
            )
        for concept in (_loader, _step, _compute):  # each edits where its knobs live in the source
            concept.edit(self)
        if self.top:
            self.insert_top()
        for src in self.sources():
            self.merged_notes += src.merge_spreads(src is self) if src.editable else []
            for call, kwargs in src.unwritten.items():
                line = ast.unparse(with_keywords(call, kwargs))
                self.notes.append(
                    f"{src.where(call, src is self)}: {callee(call)}(...) takes **kwargs, which may hold them: give "
                    f"it {', '.join(kwargs)}: {line}"
                )
            if not src.editable and src.edits:
                self.notes += said_as_lines(src)
        return self.patched()

    def sources(self) -> list[Source]:
        return [s for s in self.files.values() if s is not None]

    def others(self) -> list[Source]:
        """The other files the diff edits (modules the script builds a loader or optimizer in)."""
        return [s for s in self.sources() if s is not self and s.editable and s.edits]

    # ---- the sites the trial recorded ---------------------------------------------------------
    def sites(self, kind: str) -> list[Site] | None:
        """The recorded `kind` sites ("loaders", "optimizers") with their file and call; None: none recorded.
        A site whose file or call the source here no longer has is said, and left out."""
        if self.recorded is None:
            return None
        out = []
        for record in self.recorded.get(kind) or []:
            src = self.source_at(str(record.get("file")))
            call = src.call_at(record) if src is not None else None
            if src is None or call is None:
                self.notes.append(
                    f"{self.name_of(str(record.get('file')))}:{record.get('line')}: the {record.get('type')} a trial "
                    "built there is not in this file's source any more: its arguments are not edited"
                )
                continue
            out.append(Site(record, src, call))
        return out

    def source_at(self, path: str) -> Source | None:
        key = os.path.realpath(path)
        if key not in self.files:
            try:
                name = self.name_of(path)
                editable = not (name.startswith("..") or os.path.isabs(name))
                self.files[key] = Source(path, name if editable else path, Path(path).read_bytes(), editable)
            except (OSError, SyntaxError, ValueError):
                self.files[key] = None
        return self.files[key]

    # ---- writing a measured value ---------------------------------------------------------------
    def write(self, src: Source, call: ast.Call, name: str, value: Any, position: int | None = None) -> None:
        """Make `call` run `name=value` where the script's own value differs (the caller decides that): a
        literal replaced; an argparse option's default changed, the call keeping the user's argument; a
        keyword added; an expression the script computes at run time said, with the line to write."""
        given = src.argument(call, name, position)
        if given is None:
            src.add_keyword(call, name, value)
        elif literal(given) is not UNKNOWN:
            if not same(given, value):
                src.replace(given, repr(value))
        elif (option := src.option(given)) is not None:
            self.set_default(src, *option, value)
        else:
            self.notes.append(
                f"{src.where(call, src is self)}: {name}={src.text(given)} is computed at run time: the best ran "
                f"{name}={value!r}; write {name}={value!r} there"
            )

    def set_default(self, src: Source, add: ast.Call, flags: list[str], value: Any) -> None:
        """An argparse option's default, so the script's own flag keeps working; said where the study's
        arguments give the flag (the default is then not what runs)."""
        default = next((k.value for k in add.keywords if k.arg == "default"), None)
        if default is None:
            src.add_keyword(add, "default", value)
        elif literal(default) is not UNKNOWN:
            if not same(default, value):
                src.replace(default, repr(value))
        else:
            self.notes.append(
                f"{src.where(add, src is self)}: {flags[0]}'s default {src.text(default)} is computed at run time: "
                f"the best ran {value!r}; run the script with {flags[-1]} {value}"
            )
            return
        given = [w for w in self.job.args if w in flags or any(w.startswith(f + "=") for f in flags if f[:2] == "--")]
        if given and src is self:
            self.flags[tuple(flags)] = value
            self.notes.append(
                f"{flags[-1]}: the study ran the script with {given[-1]}, which overrides the default: run it with "
                f"{flags[-1]} {value}"
            )

    def own(self, src: Source, call: ast.Call, name: str, default: Any, position: int | None = None) -> Any:
        """What the script gives `call` as `name`, read from the source: a literal, an argparse option's value
        (the study's arguments applied), the default when it gives none; UNKNOWN for anything else."""
        given = src.argument(call, name, position)
        if given is None:
            return default
        value = literal(given)
        option = src.option(given) if value is UNKNOWN else None
        if option is None:
            return value
        add, flags = option
        default_node = next((k.value for k in add.keywords if k.arg == "default"), None)
        value = None if default_node is None else literal(default_node)
        args = self.job.args if src is self else []
        for i, word in enumerate(args):
            for flag in flags:
                if word == flag and i + 1 < len(args):
                    value = parsed(args[i + 1], value)
                elif flag.startswith("--") and word.startswith(flag + "="):
                    value = parsed(word[len(flag) + 1 :], value)
        return value

    # ---- keywords -----------------------------------------------------------------------------
    def set_keyword(self, call: ast.Call, name: str, value: Any, default: Any, position: int | None = None) -> None:
        """Make `call` pass `name=value`: its keyword or positional argument replaced when it differs, or
        the keyword added when the default it runs with differs."""
        given = self.argument(call, name, position)
        if given is not None:
            if not same(given, value):
                self.replace(given, repr(value))
            return
        if value != default:
            self.add_keyword(call, name, value)

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


@dataclass(frozen=True)
class Site:
    """A DataLoader or optimizer a trial built: its record (Export.sites), its file, its call there."""

    record: Mapping[str, Any]
    src: Source
    call: ast.Call

    def used(self) -> bool:
        """Whether a trial iterated the loader or stepped the optimizer: what was measured."""
        return bool(self.record.get("iterated") or self.record.get("stepped"))


def api_calls(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """Each call into autotune.script in the source, with the API function it calls (the aliases
    autotune.pipelines.script.source.scan accepts)."""
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
