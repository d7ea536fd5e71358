"""The export applied to a copy of the user's script: what the end of a script study runs alone against the
script as written (search/loop/alone.py), so the figure it gives is the one the user gets from the diff.

The copy is the script with `export --format diff`'s edits made (the same `Rewrite`, so no `patch`
binary is needed), written into the study's folder; the user's file is never touched. What the diff
cannot write (apply/export/diff.py's "not in the diff" notes) is returned beside it: the copy runs
without it, as the patched script would.

May import: autotune.core, autotune.search, autotune.trial, autotune.pipelines (and the rest of apply).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.apply.export.diff import Rewrite
from autotune.core.config import TrialConfig, baseline_of
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
    if cfg.knobs() != baseline_of(cfg).knobs():
        rewrite = Rewrite(source, cfg, job, "cpu" if device in (None, "cpu") else "cuda", sites=sites)
        source = rewrite.apply()
        notes = tuple(rewrite.notes)
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / original.name
    write_atomic(copy, source.decode())
    return Patched(original, copy, tuple(args), notes)
