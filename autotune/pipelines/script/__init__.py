"""`--pipeline script:PATH [ARGS...]`: the user's own training script, run as written in each trial.

The spec holds the script's absolute path and its own command-line arguments, shell-quoted
(`script:/abs/train.py --epochs 1 data/`), so every trial, a worker, and `autotune trial --config
best.yaml` re-run the same command with no new TrialConfig field. autotune.trial.script runs it with
runpy, its seams installed in torch first; this package owns what needs no trial: the spec, the checks
on the file, and which knobs the script can take.

Which knobs a script takes is decided statically, from its source (`ast`), before the first trial:
  - the no-edit knobs (optimizer_fusion, set_to_none, cudnn_benchmark, num_threads) reach any script
    through torch's own seams;
  - the loader knobs need a `DataLoader` in the script's source;
  - precision needs a call to `at.autocast()`, channels_last and compile one to `at.model()`
    (autotune.script, the cooperative API).
A static declaration is chosen over a probe run because it is free, known before the space is
resolved, and cannot be fooled by a first run that takes another branch; the trial then records what
each knob really did (`applied`), so a seam the scan credited but the run never reached says so.

May import: autotune.core, autotune.pipelines (never torch at import).
"""

from __future__ import annotations

import ast
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.errors import PipelineError
from autotune.pipelines.frameworks import STRATEGY, FrameworkJob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

PREFIX = "script:"
API_MODULE = "autotune.script"
LOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
# Knob -> the at.* call that routes it.
COOPERATIVE = {"precision": "autocast", "channels_last": "model", "compile": "model"}
# What no script takes yet, with why.
ALWAYS = {
    "batch_size": "the script's own batch size is kept: changing it changes its training, and its lr, "
    "schedule and accumulation are its own",
    "gpus": "the script runs as one process; its own DDP set-up under torchrun is not wired yet",
    "checkpoint_segments": "the script's forward owns activation checkpointing",
    **{k: "the script runs as one process: nothing to replicate or shard" for k in STRATEGY},
}


def is_script(spec: str) -> bool:
    return spec.startswith(PREFIX)


def parse(spec: str) -> tuple[str, list[str]]:
    """'script:train.py --epochs 1' -> ('train.py', ['--epochs', '1'])."""
    try:
        words = shlex.split(spec[len(PREFIX) :])
    except ValueError as e:
        raise PipelineError(f"--pipeline {spec!r}: cannot split its arguments ({e})") from None
    if not words:
        raise PipelineError(f"--pipeline {spec!r}: expected 'script:PATH [ARGS...]'")
    return words[0], words[1:]


def spec_of(path: str, args: list[str] | tuple[str, ...] = ()) -> str:
    """The spec for a script and its arguments, the path made absolute and the file checked."""
    resolved = Path(path).expanduser().resolve()
    check_source(str(resolved), f"script {path!r}")
    return PREFIX + shlex.join([str(resolved), *args])


def normalize(spec: str) -> str:
    """A spec as the user wrote it, with its script's path made absolute (checked: exit 2 if bad)."""
    path, args = parse(spec)
    return spec_of(path, args)


def check_source(path: str, what: str) -> ast.Module:
    """The script's syntax tree; a missing, unreadable or unparsable file is bad input, in one line."""
    try:
        source = Path(path).read_text()
    except FileNotFoundError:
        raise PipelineError(f"{what}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PipelineError(f"{what}: cannot read it ({e})") from None
    try:
        compile(source, path, "exec")
        return ast.parse(source, path)
    except (SyntaxError, ValueError) as e:
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise PipelineError(f"{what} is not valid Python{where}: {getattr(e, 'msg', e)}") from None


@dataclass(frozen=True)
class Uses:
    """What a script's source routes: a DataLoader, and the at.* calls it makes."""

    dataloader: bool
    api: frozenset[str]


def scan(tree: ast.Module) -> Uses:
    """The DataLoader and the autotune.script calls named in a script's syntax tree."""
    aliases: set[str] = set()  # names bound to the API module
    direct: dict[str, str] = {}  # local name -> API function
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "autotune":
            aliases |= {a.asname or a.name for a in node.names if a.name == "script"}
        elif isinstance(node, ast.ImportFrom) and node.module == API_MODULE:
            direct |= {a.asname or a.name: a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == API_MODULE and a.asname}
    api: set[str] = set()
    loader = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "DataLoader":
            loader = True
        if isinstance(node, ast.Attribute) and node.attr == "DataLoader":
            loader = True
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            api.add(f.attr)
        elif isinstance(f, ast.Attribute) and ast.unparse(f.value) == API_MODULE:
            api.add(f.attr)
        elif isinstance(f, ast.Name) and f.id in direct:
            api.add(direct[f.id])
    return Uses(loader, frozenset(api))


def unsupported(uses: Uses) -> dict[str, str]:
    """Knob -> why the script cannot take it, from what its source routes."""
    out = dict(ALWAYS)
    if not uses.dataloader:
        out |= {k: "the script builds no torch DataLoader (none in its source)" for k in LOADER_KNOBS}
    for knob, call in COOPERATIVE.items():
        if call not in uses.api:
            out[knob] = f"the script never calls at.{call}() ({API_MODULE})"
    return out


class ScriptJob(FrameworkJob):
    """A checked script: its path and arguments, what it routes, and the knobs it cannot take."""

    library = "script"

    def __init__(self, spec: str, path: str, args: list[str], uses: Uses) -> None:
        super().__init__(spec, (path, tuple(args)), unsupported(uses))
        self.path, self.args, self.uses = path, list(args), uses

    def build_model(self) -> Any:
        raise PipelineError(
            f"--pipeline {self.spec!r} is your own script, run whole: it has no model or dataset to build "
            "apart (for `autotune train` or the memory probe); run it with the exported changes "
            "(autotune export --format script)"
        )

    build_dataset = build_model


def load(cfg: TrialConfig) -> ScriptJob:
    path, args = parse(cfg.pipeline)
    if not Path(path).is_absolute():
        path = str(Path(path).resolve())
    return ScriptJob(cfg.pipeline, path, args, scan(check_source(path, f"script {path!r}")))
