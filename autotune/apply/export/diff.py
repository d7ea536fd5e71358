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

from autotune.core.config import TrialConfig, baseline_of, lr_factor
from autotune.core.configfile import Export
from autotune.core.errors import ConfigError, PipelineError
from autotune.pipelines import script

# DataLoader's positional order (torch.utils.data.DataLoader.__init__), for a script that passes the
# loader knobs positionally; prefetch_factor and persistent_workers are keyword-only.
LOADER_POSITION = {"num_workers": 5, "pin_memory": 7}
# torch.optim classes that take both `fused` and `foreach`: the trial sets the flags only on those.
FUSABLE = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
NO_CHANGE = "# autotune: no change: the fastest configuration measured is {path} as written"


@dataclass(frozen=True)
class Edit:
    """Replace source bytes [start, end) with `text` (start == end: insert)."""

    start: int
    end: int
    text: str


def renders(e: Export) -> bool:
    return script.is_script(e.config.pipeline)


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


class Rewrite:
    """The edits that make one script's source run `cfg`, and what it could not say in the source."""

    def __init__(self, source: bytes, cfg: TrialConfig, job: script.ScriptJob, device: str) -> None:
        self.source, self.cfg, self.job, self.device = source, cfg, job, device
        self.tree = ast.parse(source)
        self.calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)]
        self.skip = job.unsupported
        self.base = baseline_of(cfg)
        self.starts = [0]
        for line in source.splitlines(True):
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[Edit] = []
        self.notes: list[str] = []
        self.top: list[str] = []  # lines added after the script's imports
        self.unwritten: dict[ast.Call, list[str]] = {}  # a call given **kwargs -> the keywords it needs

    def apply(self) -> bytes:
        calls = self.calls
        api = api_calls(self.tree)
        if not set(script.LOADER_KNOBS) & self.skip:
            for call in calls:
                if callee(call) == "DataLoader":
                    self.loader(call)
        self.fusion([c for c in calls if callee(c) in FUSABLE or callee(c) == "FusedAdam"])
        for call in calls:
            if callee(call) == "zero_grad" and isinstance(call.func, ast.Attribute):
                self.set_keyword(call, "set_to_none", self.cfg.set_to_none, True, position=0)
        self.globals(calls)
        self.cooperative(api)
        self.lr(api, calls)
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

    def loader(self, call: ast.Call) -> None:
        cfg = self.cfg
        workers = cfg.num_workers > 0  # the trial's loader_overrides: DataLoader refuses both without workers
        target: dict[str, Any] = {
            "num_workers": cfg.num_workers,
            "pin_memory": cfg.pin_memory,
            "persistent_workers": cfg.persistent_workers if workers else False,
            "prefetch_factor": (cfg.prefetch_factor or 2) if workers else None,
        }
        defaults: dict[str, Any] = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}
        defaults["prefetch_factor"] = 2 if workers else None  # DataLoader's None means 2 with workers
        for name, value in target.items():
            self.set_keyword(call, name, value, defaults[name], LOADER_POSITION.get(name))

    def fusion(self, constructors: list[ast.Call]) -> None:
        # A trial that is not the baseline sets both flags on every fusable optimizer, whatever its
        # fusion: so does the diff. `foreach=None`, torch's default, is foreach only on CUDA tensors.
        fusion = self.cfg.optimizer_fusion
        if "optimizer_fusion" in self.skip:
            return
        if fusion == "apex":
            self.notes.append("optimizer_fusion=apex: construct apex.optimizers.FusedAdam in place of your optimizer")
            return
        names = script.LINEAR_RULE | script.SQRT_RULE | script.OTHER_OPTIMIZERS
        flagless = sorted({callee(c) for c in self.calls if callee(c) in names - FUSABLE - {"FusedAdam", "FusedLAMB"}})
        if flagless and fusion != "none":
            self.notes.append(
                f"optimizer_fusion={fusion}: {', '.join(flagless)} takes no fused/foreach pair, so the trial left "
                "its flags as written"
            )
        for call in constructors:
            if callee(call) == "FusedAdam":
                continue
            if fusion == "none":
                self.set_keyword(call, "foreach", False, False if self.device == "cpu" else None)
            else:
                self.set_keyword(call, fusion, True, None)
            # The other flag, where the script gives it, must not contradict (torch refuses both True).
            other = "fused" if fusion in ("none", "foreach") else "foreach"
            given = next((k.value for k in call.keywords if k.arg == other), None)
            if given is not None and not same(given, False):
                self.replace(given, "False")

    def globals(self, calls: list[ast.Call]) -> None:
        """cudnn.benchmark and the thread count: a trial sets them before the script runs, so a line of
        the script's own that sets them ran after it and won; only where the script has none is one added."""
        cfg = self.cfg
        if "cudnn_benchmark" not in self.skip:
            assigns = [
                n
                for n in ast.walk(self.tree)
                if isinstance(n, ast.Assign) and any(ast.unparse(t).endswith("cudnn.benchmark") for t in n.targets)
            ]
            if assigns and not all(same(n.value, cfg.cudnn_benchmark) for n in assigns):
                self.notes.append(
                    f"cudnn_benchmark={cfg.cudnn_benchmark}: the script sets it itself (line {assigns[0].lineno}), "
                    "after the trial did, so its own value is what ran"
                )
            if not assigns and cfg.cudnn_benchmark:
                self.top.append("torch.backends.cudnn.benchmark = True  # autotune: cudnn_benchmark")
        if "num_threads" not in self.skip and cfg.num_threads:
            sets = [c for c in calls if callee(c) == "set_num_threads"]
            if sets and not all(c.args and same(c.args[0], cfg.num_threads) for c in sets):
                self.notes.append(
                    f"num_threads={cfg.num_threads}: the script calls torch.set_num_threads itself "
                    f"(line {sets[0].lineno}), after the trial did, so its own count is what ran"
                )
            if not sets:
                self.top.append(f"torch.set_num_threads({cfg.num_threads})  # autotune: num_threads")

    def cooperative(self, api: list[tuple[str, ast.Call]]) -> None:
        cfg, base = self.cfg, self.base
        dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(cfg.precision)
        precision = "precision" not in self.skip and cfg.precision != base.precision
        for name, call in api:
            # Outside a trial at.autocast() is a null context and at.scaler() a disabled GradScaler: only
            # a precision that needs more than that is written as the torch call.
            if name == "autocast" and precision and dtype:
                self.replace(call, f"torch.autocast({self.device!r}, dtype={dtype})")
            elif name == "scaler" and precision and cfg.precision == "fp16":
                self.replace(call, f"torch.amp.GradScaler({self.device!r})")
            elif name == "model" and call.args:
                self.model(call)
            elif name == "batch_size" and "batch_size" not in self.skip and self.job.own is not None:
                if cfg.batch_size != self.job.own[0]:
                    self.default(call, cfg.batch_size)
            elif name == "accumulation" and cfg.global_batch is not None and self.job.own is not None:
                if cfg.grad_accum != self.job.own[1]:
                    self.default(call, cfg.grad_accum)

    def model(self, call: ast.Call) -> None:
        cfg, base = self.cfg, self.base
        cl = "channels_last" not in self.skip and cfg.channels_last != base.channels_last
        comp = "compile" not in self.skip and cfg.compile != base.compile
        if not (cl or comp):
            return
        expr = self.text(call.args[0])
        if cfg.channels_last and "channels_last" not in self.skip:
            expr = f"{expr}.to(memory_format=torch.channels_last)"
        if cfg.compile != "off" and "compile" not in self.skip:
            mode = "" if cfg.compile == "default" else f", mode={cfg.compile!r}"
            expr = f"torch.compile({expr}{mode})"
        self.replace(call, expr)

    def default(self, call: ast.Call, value: int) -> None:
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
        if arg is None:
            offset = self.span(call)[1] - 1
            self.edits.append(Edit(offset, offset, repr(value)))
        else:
            self.replace(arg, repr(value))

    def lr(self, api: list[tuple[str, ast.Call]], calls: list[ast.Call]) -> None:
        """The factor the trial put on the script's own lr for the global batch it ran (the trial's
        batch_handover): at.lr()'s default, else the lr its optimizer constructors are given."""
        own, cfg = self.job.own, self.cfg
        if own is None:
            return
        accum = cfg.grad_accum if cfg.global_batch is not None else own[1]
        ran = cfg.batch_size * cfg.gpus * accum
        factor = lr_factor(ran / (own[0] * own[1]), cfg.lr_scaling)
        if factor == 1:
            return
        targets = [c.args[0] if c.args else None for n, c in api if n == "lr"]
        if not targets:
            names = set(script.LINEAR_RULE | script.SQRT_RULE | script.OTHER_OPTIMIZERS)
            targets = [lr_argument(c) for c in calls if callee(c) in names]
        for node in targets:
            if node is None:
                self.notes.append(
                    f"lr: the optimizer runs at its default lr; the trial scaled it by {factor:.6g} "
                    f"({cfg.lr_scaling} rule, global batch {own[0] * own[1]} -> {ran}): give it lr=<default> * {factor:.6g}"
                )
            else:
                self.replace(node, f"{self.text(node)} * {factor:.6g}")

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
