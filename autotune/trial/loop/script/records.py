"""What a script trial records of the script's run, from what the run showed (Shown): each knob's effect in
`applied`'s shape (observed, not the config's echo; each knob's own module says how), the construction
sites the diff edits, what the run showed.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.core import knobs as described
from autotune.core.config import TrialConfig
from autotune.core.effects import AS_WRITTEN, Seen, effects, knob_effect
from autotune.pipelines.script import ScriptJob, api
from autotune.trial.loop import knobs
from autotune.trial.loop.knobs import precision
from autotune.trial.loop.script import batch, loader, optimizer
from autotune.trial.loop.script.shown import Shown
from autotune.trial.measurement import observe


def what_ran(cfg: TrialConfig, shown: Shown, trial: api.Trial, job: ScriptJob, as_written: bool) -> dict[str, Any]:
    """The trial's `applied` beyond the process set-up, from what the run showed: each knob as it was in
    effect (the loaders, the optimizer, the at.* calls, the model, the ranks) recorded against the config
    once, the batch and lr that ran, the sites the diff edits (the model among them: its class and the
    blocks checkpointed), and what the run showed (`observed`)."""
    refused = job.refused()  # the knobs the run decides (a guess from the source) are recorded as they ran
    why = AS_WRITTEN if as_written else ""
    seen = batch.seen(shown, trial) | loader.seen(shown, refused, why) | optimizer.seen(shown, why)
    seen |= process_seen(why, cfg.num_threads) | model_seen(trial, shown.final, as_written, refused)
    applied = effects(cfg, seen | shown.model_seen, refused)
    extra = batch.batch_and_lr(cfg, shown, trial, job)
    applied["script"] = script_record(shown, trial) | precision.amp_record(trial) | extra.pop("script")
    applied |= extra
    if shown.model:
        applied["script"]["model"] = shown.model
    applied["script"]["sites"] = shown.sites
    applied["throughput"] = batch.throughput(trial, shown)
    applied["observed"] = shown.final
    if cfg.profile:
        applied["profile"] = knob_effect(True, False, "the script owns the loop: profile it with torch.profiler")
    return applied


def script_record(shown: Shown, trial: api.Trial) -> dict[str, Any]:
    """What the script ran, as the run showed it: its loaders and optimizers, its at.* calls, its steps, the
    device, ranks and global batch it ran on, its own batch, its seeds and where its data order came from."""
    return {
        "requested": None,
        "in_effect": None,
        "loaders": list(shown.loaders),
        "optimizers": list(shown.stepped),
        "api_calls": dict(trial.calls),
        "optimizer_steps": shown.steps,
        "lr_last_step": list(shown.lr_last_step),
        "samples_per_step": shown.samples_per_step,
        "device": shown.final.get("device"),
        "world_size": shown.final.get("world_size"),
        "process_group": shown.process_group,
        "global_batch": shown.final.get("global_batch"),
        "batches_per_step": shown.batches or None,
        "own": batch.own_as_run(trial, shown),
        "seeded": bool(shown.seeds),
        "seeds": list(shown.seeds[:3]),
        "data_order": loader.data_order(shown, trial),
    }


def process_seen(why: str, threads: int) -> Seen:
    """The process's flags (the knob list's) and thread count, as the script ran under them (set before it
    ran: `threads` by torch.set_num_threads, 0 left to torch)."""
    return {
        **{k.NAME: (observe.torch_flag(k.SEEN), why) for k in described.FLAGS},
        "num_threads": (
            torch.get_num_threads(),
            why or (f"torch.set_num_threads({threads})" if threads else "0 = torch default"),
        ),
    }


def model_seen(trial: api.Trial, final: dict[str, Any], as_written: bool, unsupported: frozenset[str]) -> Seen:
    """Each model knob a script routes through its at.* call (at.autocast()'s precision, the memory format
    and compilation of the model at.model() got), as the run showed it, and the ranks."""
    out: Seen = {
        k.NAME: k.handed_seen(trial, final, as_written) for call in trial.calls for k in knobs.routed_through(call)
    }
    if "gpus" not in unsupported:
        ranks = final.get("ranks")
        why = f"{ranks['how']}; {ranks['others']}" if ranks else "the ranks of the script's own process group"
        out["gpus"] = (final.get("world_size"), why)
    return out
