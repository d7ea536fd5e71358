"""What a script trial records of the script's run, read where the seams saw it: each knob's effect in
`applied`'s shape (observed, not the config's echo; each knob's own module says how), the construction
sites the diff edits, what the run showed.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from autotune.core import knobs as described
from autotune.core.config import TrialConfig
from autotune.core.effects import Seen, knob_effect, seen_effects, unsupported_effects
from autotune.pipelines.script import ScriptJob, api
from autotune.trial.loop import knobs
from autotune.trial.loop.knobs import precision
from autotune.trial.loop.script import batch, loader, optimizer
from autotune.trial.loop.script.baseline import AS_WRITTEN
from autotune.trial.loop.script.sites import plain
from autotune.trial.measurement import observe

if TYPE_CHECKING:
    from autotune.trial.loop.script.seams import Seams


def what_ran(cfg: TrialConfig, seams: Seams, trial: api.Trial, job: ScriptJob, as_written: bool) -> dict[str, Any]:
    """The trial's `applied` beyond the process set-up: each knob as the seams saw it in effect (the loaders,
    the optimizer, the at.* calls, the model), the batch and lr that ran, the sites the diff edits (the model
    among them: its class and the blocks checkpointed), and what the run showed (`observed`)."""
    refused = job.refused()  # the knobs the run decides (a guess from the source) are recorded as they ran
    applied = unsupported_effects(cfg, refused) | observed(cfg, seams, trial, as_written, refused)
    extra = batch.batch_and_lr(cfg, seams, trial, job)
    applied["script"] |= extra.pop("script")
    applied |= extra | seams.model.effects()
    if model := seams.model.record():
        applied["script"]["model"] = model
    applied["observed"] = seams.final
    applied["script"]["sites"] = seams.sites | ({"model": site} if (site := seams.model.site()) else {})
    if cfg.profile:
        applied["profile"] = knob_effect(True, False, "the script owns the loop: profile it with torch.profiler")
    return applied


def observed(
    cfg: TrialConfig, seams: Seams, trial: api.Trial, as_written: bool, unsupported: frozenset[str]
) -> dict[str, Any]:
    """What each routed knob did in the script's process, in `applied`'s shape: what each knob's module saw,
    recorded against the config in one place (an unsupported knob keeps its record, and why)."""
    why = AS_WRITTEN if as_written else ""
    seen = batch.seen(seams, trial) | loader.seen(seams, unsupported, why) | optimizer.seen(seams, why)
    seen |= process_seen(why, cfg.num_threads) | model_seen(trial, seams.final, as_written, unsupported)
    out: dict[str, Any] = {
        "script": script_record(seams, trial) | precision.amp_record(trial),
        "throughput": batch.throughput(trial, seams.step_samples, seams.model.fed),
    }
    return out | seen_effects(cfg, seen)


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
        "process_group": seams.ranks.process_group(),  # whose: "own", "trial", None (what trial 0 teaches)
        "global_batch": seen.get("global_batch"),
        "batches_per_step": batch.per_step(seams.step_batches) or None,
        "own": batch.own_as_run(
            trial, seams.step_samples, seams.step_batches, seams.model.fed, batch.per_step(seams.step_backwards)
        ),
        "seeded": bool(seams.seeds),
        "seeds": seams.seeds[:3],
        "data_order": loader.data_order(seams, trial),
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
