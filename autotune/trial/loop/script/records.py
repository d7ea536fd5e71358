"""What a script trial records of the script's run, read where the seams saw it: each knob's effect in
`applied`'s shape (observed, not the config's echo; each knob's own module says how), the construction
sites the diff edits, what the run showed.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, unsupported_effects
from autotune.pipelines.script import ScriptJob, api
from autotune.trial.loop.script import channels_last, compiled, precision
from autotune.trial.loop.script.baseline import AS_WRITTEN
from autotune.trial.loop.script.batch import batch_and_lr, batch_effect, own_as_run, per_step, throughput
from autotune.trial.loop.script.loader import data_order, loader_effects
from autotune.trial.loop.script.optimizer import optimizer_effects
from autotune.trial.loop.script.sites import plain

if TYPE_CHECKING:
    from autotune.trial.loop.script.seams import Seams


def what_ran(cfg: TrialConfig, seams: Seams, trial: api.Trial, job: ScriptJob, as_written: bool) -> dict[str, Any]:
    """The trial's `applied` beyond the process set-up: each knob as the seams saw it in effect (the loaders,
    the optimizer, the at.* calls, the model), the batch and lr that ran, the sites the diff edits, and
    what the run showed (`observed`)."""
    applied = unsupported_effects(cfg, job.unsupported) | observed(cfg, seams, trial, as_written, job.unsupported)
    extra = batch_and_lr(cfg, seams, trial, job)
    applied["script"] |= extra.pop("script")
    applied |= extra | seams.model.effects()
    if model := seams.model.record():
        applied["script"]["model"] = model
    applied["observed"] = seams.final
    applied["script"]["sites"] = seams.sites
    if cfg.profile:
        applied["profile"] = knob_effect(True, False, "the script owns the loop: profile it with torch.profiler")
    return applied


def observed(
    cfg: TrialConfig, seams: Seams, trial: api.Trial, as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """What each routed knob did in the script's process, in `applied`'s shape (an unsupported knob keeps
    its record, and why)."""
    why = AS_WRITTEN if as_written else ""
    out: dict[str, Any] = {
        "script": script_record(seams, trial),
        "throughput": throughput(trial, seams.step_samples),
    }
    out["script"] |= precision.amp_record(trial)
    out |= batch_effect(cfg, seams, trial)
    out |= loader_effects(cfg, seams, unsupported, why)
    out |= optimizer_effects(cfg, seams, why)
    out |= process_effects(cfg, why)
    out |= model_effects(cfg, trial, seams.final, as_written, unsupported)
    return out


def script_record(seams: Seams, trial: api.Trial) -> dict[str, Any]:
    """What the script ran, as the seams saw it: its loaders and optimizers, its at.* calls, its steps, the
    device, ranks and global batch it ran on, its own batch, its seeds and where its data order came from."""
    seen = seams.final
    return {
        "requested": None,
        "in_effect": None,
        "loaders": seams.loaders,
        "optimizers": seams.optimizers,
        "api_calls": dict(trial.calls),
        "optimizer_steps": seams.hook_steps,
        # the lr each stepped optimizer's first group ran its last step at (after the script's own schedule)
        "lr_last_step": [plain(lrs[0]) for o in seams.stepped if (lrs := getattr(o, "_autotune_lrs", None))],
        "samples_per_step": seams.clock.samples_per_step if seams.clock is not None else None,
        "device": seen.get("device"),
        "world_size": seen.get("world_size"),
        "global_batch": seen.get("global_batch"),
        "batches_per_step": per_step(seams.step_batches) or None,
        "own": own_as_run(trial, seams.step_samples, seams.step_batches),
        "seeded": bool(seams.seeds),
        "seeds": seams.seeds[:3],
        "data_order": data_order(seams, trial),
    }


def process_effects(cfg: TrialConfig, why: str) -> dict[str, Any]:
    """The process's cudnn.benchmark and thread count, as the script ran under them (set before it ran)."""
    out: dict[str, Any] = {}
    out["cudnn_benchmark"] = knob_effect(cfg.cudnn_benchmark, torch.backends.cudnn.benchmark, why)
    out["num_threads"] = knob_effect(cfg.num_threads, torch.get_num_threads(), why or "0 = torch default")
    return out


def model_effects(
    cfg: TrialConfig, trial: api.Trial, seen: dict[str, Any], as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """The precision the model ran at, the ranks, and the memory format and compilation of the model
    at.model() got."""
    out: dict[str, Any] = {}
    if "autocast" in trial.calls:
        out["precision"] = precision.precision_effect(cfg, trial, seen, as_written)
    if "gpus" not in unsupported:
        out["gpus"] = knob_effect(cfg.gpus, seen.get("world_size"), "the ranks of the script's own process group")
    if "model" in trial.calls:
        out["channels_last"] = channels_last.handed_effect(cfg, trial)
        out["compile"] = compiled.compile_effect(cfg, trial, seen)
    return out
