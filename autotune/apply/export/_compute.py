"""How a trial's model computed (the knob list's knobs: precision, memory format, torch.compile, activation
checkpointing, the process flags; and the thread count), in every export's terms: a framework's fields and
hooks, the script's lines, the diff's edits. Each knob's own lines are its module's (autotune/core/knobs/); this
module joins them in the list's order and places them.

May import: autotune.core, autotune.search, autotune.trial, autotune.pipelines (and the rest of apply).
"""

from __future__ import annotations

import ast
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autotune.apply.export._source import Edit
from autotune.core import knobs
from autotune.core.config import TrialConfig
from autotune.pipelines.script import source

if TYPE_CHECKING:
    from autotune.apply.export.diff import Rewrite


# ---- Lightning ----------------------------------------------------------------------------------------


def lightning_trainer(cfg: TrialConfig) -> list[str]:
    return knobs.each("lightning_trainer", cfg)


def lightning_hooks(cfg: TrialConfig) -> list[str]:
    """AutotuneHooks' methods, for the knobs a Trainer has no flag for but a hook reaches."""
    return knobs.each("lightning_hooks", cfg)


def lightning_extra(cfg: TrialConfig) -> list[str]:
    """What the Trainer has no flag for, after the hooks."""
    return knobs.each("lightning_extra", cfg)


# ---- transformers -------------------------------------------------------------------------------------


def hf_precision(cfg: TrialConfig) -> list[str]:
    return knobs.each("hf_precision", cfg)


def hf_args(cfg: TrialConfig) -> list[str]:
    """The compute knobs TrainingArguments has a field for."""
    return knobs.each("hf_args", cfg)


def hf_notes(cfg: TrialConfig) -> list[str]:
    return knobs.each("hf_notes", cfg)


# ---- accelerate ---------------------------------------------------------------------------------------


def accelerate_conf(cfg: TrialConfig) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    for k in knobs.ALL:
        if (part := getattr(k, "accelerate_conf", None)) is not None:
            conf |= part(cfg)
    return conf


def accelerate_code(cfg: TrialConfig) -> list[str]:
    """train.py's lines before the loader: the process's, then the model knobs'."""
    return knobs.each("accelerate_code", cfg)


# ---- a script study -----------------------------------------------------------------------------------


def script_lines(cfg: TrialConfig) -> list[str]:
    """The script's process lines (its flags, its thread count), as the trial set them."""
    return knobs.each("script_lines", cfg)


def api_lines(cfg: TrialConfig, skip: frozenset[str], device: str) -> list[str]:
    """The at.* calls a trial set, each with the torch call it stands for without autotune."""
    return knobs.each("api_lines", cfg, device, among=tuple(k for k in knobs.MODEL if k.NAME not in skip))


def edit(rw: Rewrite) -> None:
    """The process flags and the thread count, added where the script sets none; the at.* calls whose knob
    changed become the torch calls they stand for; the model knobs routed with no edit written as plain torch
    after the optimizer's statement, where a line names the model for sure, else said."""
    _globals(rw)
    cfg, skip = rw.cfg, rw.skip
    changed = [k for k in knobs.MODEL if k.NAME not in skip and getattr(cfg, k.NAME) != getattr(rw.base, k.NAME)]
    for k in changed:
        for name, torch_call in getattr(k, "api_calls", lambda *a: {})(cfg, rw.base, rw.device).items():
            for call in rw.api(name):
                rw.replace(call, torch_call)
    if any(k.ROUTE == "model" for k in changed):
        for call in rw.api("model"):
            if call.args:
                _at_model(rw, call)
    unedited = [k for k in changed if k.NAME in rw.job.routed]
    written = _model_lines(rw, unedited)
    rw.model_written = written  # the alone copy applies the rest through the seams, never these again
    for k in sorted(unedited, key=lambda k: k.NAME):
        if k.NAME not in written:
            rw.notes.append(f"{k.NAME} {getattr(cfg, k.NAME)}: {k.HOW}; {UNEDITED_RUN}")
    others = tuple(k for k in knobs.ALL if k not in knobs.MODEL and k.NAME not in skip)
    rw.notes += knobs.each("script_notes", cfg, rw.job.uses.process_group, UNEDITED_RUN, among=others)


# A knob the trial applied to the model the script's optimizer trains (trial/loop/script/model.py), where no line
# of the script names that model for sure (_model_lines): the diff says it; `autotune run` applies it as measured.
UNEDITED_RUN = "`autotune run --config best.yaml SCRIPT ARGS` applies it, with no edit, as the trials did"
# The calls that return the module they are called on, followed back to the class it was built as.
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "float", "train", "requires_grad_"})


def _model_lines(rw: Rewrite, changed: list[ModuleType]) -> list[str]:
    """The model knobs the best config changes (in the list's order, the trial's), written as each knob's plain
    torch LINES after the statement that builds the stepped optimizer from `MODEL.parameters()`, where MODEL is
    assigned once an instance of the class the trials found (Export.sites' model); the knobs written ([] where
    nothing names the model for sure: the notes say those), less those a knob does not write (fp16 needs a
    GradScaler the script does not have)."""
    found = (rw.recorded or {}).get("model") or {}
    chosen = [k for k in changed if getattr(k, "writes_lines", lambda c: True)(rw.cfg)]
    optimizer = next((s.call for s in rw.sites("optimizers") or [] if s.used() and s.src is rw), None)
    if not chosen or not found.get("class") or optimizer is None:
        return []
    params = (
        optimizer.args[0] if optimizer.args else next((k.value for k in optimizer.keywords if k.arg == "params"), None)
    )
    if not (
        isinstance(params, ast.Call)
        and isinstance(params.func, ast.Attribute)
        and params.func.attr == "parameters"
        and isinstance(params.func.value, ast.Name)
    ):
        return []
    name = params.func.value.id
    value = source.assigned_once(rw.tree, name)
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _SAME_MODULE:
        value = value.func.value
    if not (isinstance(value, ast.Call) and rw.callee(value) == found["class"]):
        return []
    statement = _statement_of(rw.tree, optimizer)
    if statement is None or statement.end_lineno is None:
        return []
    fields: dict[str, Any] = {"m": name}
    for k in chosen:
        fields |= getattr(k, "line_fields", lambda *a: {})(rw.cfg, found, rw.device)
    indent = " " * statement.col_offset
    text = "".join(indent + line.format(**fields) + "\n" for k in chosen for line in k.LINES)
    offset = rw.starts[statement.end_lineno]
    if offset == len(rw.source) and not rw.source.endswith(b"\n"):
        text = "\n" + text
    rw.edits.append(Edit(offset, offset, text))
    return [k.NAME for k in chosen]


def _statement_of(tree: ast.Module, node: ast.AST) -> ast.stmt | None:
    """The innermost statement that holds `node`."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found: ast.AST | None = node
    while found is not None and not isinstance(found, ast.stmt):
        found = parents.get(found)
    return found


def _globals(rw: Rewrite) -> None:
    """A trial sets the process flags and the thread count before the script runs, so a line of the script's
    own that sets them ran after it and won; only where the script has none is one added (a flag only to
    turn it on: off is torch's default)."""
    cfg = rw.cfg
    for k in knobs.FLAGS:
        if k.NAME in rw.skip | rw.no_effect:
            continue
        value = getattr(cfg, k.NAME)
        for flag, setting in k.sets(value).items():
            tail = ".".join(flag.split(".")[-2:])  # cudnn.benchmark: however the script spells torch.backends
            assigns = [
                n
                for n in ast.walk(rw.tree)
                if isinstance(n, ast.Assign) and any(ast.unparse(t).endswith(tail) for t in n.targets)
            ]
            if assigns and not all(rw.same(n.value, setting) for n in assigns):
                rw.notes.append(
                    f"{k.NAME}={value}: the script sets it itself (line {assigns[0].lineno}), after the trial did, "
                    "so its own value is what ran"
                )
            if not assigns and setting is True:
                rw.top.append(f"{flag} = True  # autotune: {k.NAME}")
    if "num_threads" not in rw.skip and cfg.num_threads:
        sets = rw.calls_to("set_num_threads")
        if sets and not all(c.args and rw.same(c.args[0], cfg.num_threads) for c in sets):
            rw.notes.append(
                f"num_threads={cfg.num_threads}: the script calls torch.set_num_threads itself "
                f"(line {sets[0].lineno}), after the trial did, so its own count is what ran"
            )
        if not sets:
            rw.top.append(f"torch.set_num_threads({cfg.num_threads})  # autotune: num_threads")


def _at_model(rw: Rewrite, call: ast.Call) -> None:
    """at.model(expr), outside a trial the identity, as the torch calls of every knob it routes."""
    expr = rw.text(call.args[0])
    for k in knobs.MODEL:
        if k.ROUTE == "model" and k.NAME not in rw.skip:
            expr = k.at_model(expr, rw.cfg)
    rw.replace(call, expr)
