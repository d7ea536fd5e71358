"""The DataLoader's knobs: num_workers, pin_memory, persistent_workers, prefetch_factor. Speed only. Four
arguments of the one call that builds the training loader, with one rule between them: persistence and a
prefetch need worker processes (DataLoader refuses them without), so one module holds the four.

- Their rows (`ROWS`, which TrialConfig's fields take); persistent_workers and prefetch_factor are left at
  their defaults without workers (`needs="workers"`).
- What every job gives its DataLoader: `arguments(cfg)`. Autotune's pipelines build theirs with it
  (trial/loop/loading.py); an unedited script's DataLoader(...) gets it over the script's own arguments, by
  the seams (trial/loop/script/seams.py), with no edit; Lightning's datamodule loader is rebuilt with it;
  Hugging Face's Trainer takes it as TrainingArguments' `dataloader_*` fields (`hf_fields`, the user's own
  from `hf_own`).
- The exports: the knob table's `rows`, the DataLoader keyword lines (`kwargs_lines`, Lightning's
  dataloader_kwargs and accelerate's script), TrainingArguments' (`hf_lines`), a script's line
  (`script_lines`); the diff's edits of the script's own DataLoader(...) calls are apply/export/_loader.py's.

May import: the stdlib and the rest of autotune.core (TrialConfig only to name its type).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from autotune.core.knobs.row import IN_SCRIPT, Guided, knob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

NAMES = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
ROWS = {
    "num_workers": knob(0, "the DataLoader's worker processes", visit=2),
    "pin_memory": knob(False, "the DataLoader's page-locked host memory"),
    "persistent_workers": knob(False, "the DataLoader keeps its workers between epochs", needs="workers"),
    "prefetch_factor": knob(None, "batches each DataLoader worker loads ahead", needs="workers"),
}
# DataLoader's own defaults for them (prefetch_factor None: 2 with workers).
DEFAULTS: dict[str, Any] = {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
# TrainingArguments' field for each.
HF = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}


def arguments(cfg: TrialConfig) -> dict[str, Any]:
    """The DataLoader arguments a config sets, over any of the job's own: without workers, persistence off and
    no prefetch, which DataLoader requires (the prefetch a config leaves to torch is its 2 with workers)."""
    workers = cfg.num_workers > 0
    return {
        "num_workers": cfg.num_workers,
        "pin_memory": cfg.pin_memory,
        "persistent_workers": cfg.persistent_workers if workers else False,
        "prefetch_factor": cfg.loader_prefetch,
    }


def guide(on: Guided) -> dict[str, Any]:
    """The guides' loader: a worker for each usable CPU, kept between epochs and loading two batches ahead,
    into pinned memory where a GPU copies from it."""
    workers = on.workers > 0
    return {
        "num_workers": on.workers,
        "pin_memory": on.cuda,
        "persistent_workers": workers,
        "prefetch_factor": 2 if workers else None,
    }


def own(loader: Any) -> dict[str, Any]:
    """A built DataLoader's own values of the knobs, as a config holds them (persistence and a prefetch only with
    workers)."""
    workers = int(loader.num_workers)
    return {
        "num_workers": workers,
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(loader.persistent_workers) and workers > 0,
        "prefetch_factor": loader.prefetch_factor if workers > 0 else None,
    }


def hf_fields(cfg: TrialConfig) -> dict[str, Any]:
    """TrainingArguments' dataloader_* fields for a config."""
    return {HF[k]: v for k, v in arguments(cfg).items()}


def hf_own(args: Any) -> dict[str, Any]:
    """The user's own values, read from their TrainingArguments' fields as from a DataLoader."""
    return own(SimpleNamespace(**{k: getattr(args, field) for k, field in HF.items()}))


def rows(target: str) -> dict[str, str]:
    """The knob table's rows for the four, in `target`'s terms."""
    if target == "lightning":
        return {k: f"dataloader_kwargs[{k!r}]" for k in ROWS}
    if target == "hf":
        return {k: HF[k] for k in ROWS}
    return {k: f"{IN_SCRIPT}, DataLoader({k}=...)" for k in ROWS}


def kwargs_lines(cfg: TrialConfig, indent: str) -> list[str]:
    """The DataLoader keyword arguments, one per line."""
    return [f"{indent}{k}={v!r}," for k, v in arguments(cfg).items()]


def hf_lines(cfg: TrialConfig) -> list[str]:
    return [f"    {field}={v!r}," for field, v in hf_fields(cfg).items()]


def script_lines(cfg: TrialConfig) -> list[str]:
    """A script's DataLoader line (persistence and prefetch only with workers)."""
    kw = ", ".join(
        f"{k}={v}" for k, v in arguments(cfg).items() if cfg.num_workers or k in ("num_workers", "pin_memory")
    )
    return [f"DataLoader(..., {kw})"]
