"""The export applied to a copy of the user's script: what the end of a script study runs alone against the
script as written (search/loop/alone.py), so the figure it gives is the one the user gets from the diff.

The copy is the script with `export --format diff`'s edits made (the same `Rewrite`, so no `patch`
binary is needed), written into the study's folder beside copies of the modules the diff edits too
(where the script builds its optimizer: model.py; a package's Python files whole), at their paths
relative to the script; the user's files are never touched. The copy runs with its own folder first on
sys.path, then the script's, so it imports the edited modules and the user's others. What the diff
cannot write (apply/export/diff.py's "not in the diff" notes) is returned beside it: the copy runs
without it, as the patched script would.

May import: autotune.core, autotune.search, autotune.trial, autotune.pipelines (and the rest of apply).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.apply.export.diff import Rewrite
from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError, PipelineError
from autotune.core.files import write_atomic
from autotune.pipelines import script


@dataclass(frozen=True)
class Patched:
    """The user's script (`original`), its patched copy, and what the diff could not write into it."""

    original: Path
    copy: Path
    args: tuple[str, ...]
    notes: tuple[str, ...] = ()
    modules: tuple[Path, ...] = ()  # the copies of the other files the diff edits, beside `copy`
    # The arguments the copy runs with: the study's, with each flag the export tells the user to give
    # ("run it with --workers 0") given so, as the user will run it.
    copy_args: tuple[str, ...] = ()
    # The config whose model knobs no diff writes (an unedited script's model knobs, the knob list's,
    # checkpointing), for the copy's runs to apply as `autotune run` does; None: none differ.
    model: Path | None = None


def patched_copy(
    cfg: TrialConfig, folder: Path, device: str | None = None, sites: Mapping[str, Any] | None = None
) -> Patched:
    """Write `cfg`'s export into a copy of its script under `folder` (made if missing), at the DataLoader and
    optimizer `sites` its trial recorded (the diff's own rule: Export.sites). A config that is the
    baseline's is the script as written: its copy is byte for byte the original. ConfigError when the
    script cannot be read."""
    path, args = script.parse(cfg.pipeline)
    try:
        job = script.load(cfg)
    except PipelineError as e:
        raise ConfigError(f"the study's script is not readable on this machine: {e}") from None
    original = Path(job.path)
    source = original.read_bytes()
    notes: tuple[str, ...] = ()
    others: dict[Path, bytes] = {}
    copy_args = tuple(args)
    model: Path | None = None
    routed: list[str] = []
    if not cfg.is_baseline:
        rewrite = Rewrite.measured(source, cfg, job, device, sites)
        source = rewrite.apply()
        notes = tuple(rewrite.notes)
        others = {folder / other.name: other.patched() for other in rewrite.others()}  # names inside its folder
        copy_args = with_flags(tuple(args), rewrite.flags)
        changed = [k for k in job.routed if k in cfg.changed]
        # A knob the diff wrote as torch lines runs in the copy already: applied again, it would run twice.
        if routed := sorted(k for k in changed if k not in rewrite.model_written):
            model = folder / "model.json"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / original.name
    write_atomic(copy, source.decode())
    for package in {p.relative_to(folder).parts[0] for p in others if p.parent != folder}:
        _copy_package(original.parent / package, folder / package)
    for module, text in others.items():
        write_atomic(module, text.decode())
    if model is not None:
        write_atomic(model, json.dumps({"config": cfg.to_dict(), "routed": routed}))
    return Patched(original, copy, tuple(args), notes, tuple(others), copy_args, model)


def with_flags(args: tuple[str, ...], flags: Mapping[tuple[str, ...], Any]) -> tuple[str, ...]:
    """`args` with each option of `flags` (any of its spellings) given its value: `-j 2`, `--workers 2` or
    `--workers=2` -> the same flag with 0."""
    out = list(args)
    for spellings, value in flags.items():
        for i, word in enumerate(out):
            for flag in spellings:
                if word == flag and i + 1 < len(out):
                    out[i + 1] = str(value)
                elif flag.startswith("--") and word.startswith(flag + "="):
                    out[i] = f"{flag}={value}"
    return tuple(out)


def _copy_package(src: Path, dst: Path) -> None:
    """A package the diff edits a module of, its Python files copied whole: a package found first on
    sys.path is the one imported, so the copy must hold all of it, not the edited module alone."""
    for path in src.rglob("*.py"):
        (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / path.relative_to(src))
