"""What a script trial records of the script's run, from what the run showed (Shown): each knob's effect in
`applied`'s shape (observed, not the config's echo: the DataLoaders', the optimizer's, the process's, the
model's, the batch the script ran), recorded against the config once; the lr it trained with and the rule
between them, the global batch its ranks ran, the unit its figure counts; the construction sites the diff
edits; what the run showed.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any


from autotune.core.config import TrialConfig
from autotune.core.effects import AS_WRITTEN, Seen, effects, knob_effect, lr_effect
from autotune.pipelines.script import LOADER_KNOBS, ScriptJob, api, rule_of
from autotune.trial.loop import knobs
from autotune.trial.loop.script.loader import UNMEASURED
from autotune.trial.loop.script.shown import Shown


OWN_SCHEDULE = "the script sets its optimizer's lr itself before its steps (a schedule of its own)"
# A batch nothing in the run showed: recorded as unknown, never as the config's placeholder.
UNSEEN = (
    "not seen: no DataLoader delivered it, none was handed over (at.batch_size()), and its model was never "
    "called with a tensor"
)


def what_ran(
    cfg: TrialConfig, shown: Shown, process: Seen, trial: api.Trial, job: ScriptJob, as_written: bool
) -> dict[str, Any]:
    """The trial's `applied` from what the run showed: each knob as it was in effect (the loaders, the
    optimizer, the at.* calls, the model, the ranks, and `process`: the process knobs as the script left them)
    recorded against the config once, the batch and lr that ran, the sites the diff edits (the model among them: its class and the
    blocks checkpointed), and what the run showed (`observed`)."""
    refused = job.refused()  # the knobs the run decides (a guess from the source) are recorded as they ran
    why = AS_WRITTEN if as_written else ""
    seen = batch_seen(shown, trial, job.own) | loader_seen(shown, refused, why) | optimizer_seen(shown, why)
    seen |= {k: (v, why or said) for k, (v, said) in process.items()}
    seen |= model_seen(trial, shown.final, as_written, refused)
    applied = effects(cfg, seen | shown.model_seen, refused)
    extra = batch_and_lr(cfg, shown, trial, job)
    applied["script"] = script_record(shown, trial) | knobs.handed_records(trial) | extra.pop("script")
    applied |= extra
    if shown.model:
        applied["script"]["model"] = shown.model
    applied["script"]["sites"] = shown.sites
    applied["throughput"] = throughput(trial, shown)
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
        "own": own_as_run(trial, shown),
        "seeded": bool(shown.seeds),
        "seeds": list(shown.seeds[:3]),
        "data_order": data_order(shown, trial),
    }


def batch_seen(shown: Shown, trial: api.Trial, read: tuple[int, int] | None) -> Seen:
    """The micro-batch the script ran: its own as its loaders delivered it (or its model was fed), else the one
    handed over (and where its own default is not the one its source reads, `read`: ScriptJob.own, what it
    is), else its first DataLoader's; unknown (None) when none shows one."""
    loader = shown.loaders[0] if shown.loaders else None
    ran = own_as_run(trial, shown)
    got, own = trial.returned, trial.defaults
    if ran is not None and "batch_size" not in got:  # its own batch, as its loaders delivered it
        return {"batch_size": (ran["batch_size"], f"the script's own batch: {ran['from']}")}
    if "batch_size" in got:
        why = through(trial)
        if read is not None and own.get("batch_size", read[0]) != read[0]:  # the baseline is not its own
            why += f"; the script's own default is {own['batch_size']}, not the {read[0]} its source reads"
        return {"batch_size": (got["batch_size"], why)}
    if loader:
        return {"batch_size": (loader["batch_size"], "the script's own DataLoader batch size")}
    return {"batch_size": (None, UNSEEN)}


def loader_seen(shown: Shown, unsupported: frozenset[str], why: str) -> Seen:
    """Each supported DataLoader knob as the script's first loader it was applied to ran it (`autotune run`
    leaves the loaders no trial measured as written), else its first."""
    loader = next(
        (x for x in shown.loaders if x.get("kept") != UNMEASURED), shown.loaders[0] if shown.loaders else None
    )
    out: Seen = {}
    for k in LOADER_KNOBS:
        if k in unsupported:
            continue
        out[k] = (
            (loader[k], loader.get("kept", why)) if loader else (None, "the script built no DataLoader in this run")
        )
    return out


def optimizer_seen(shown: Shown, why: str) -> Seen:
    """The optimizer's fusion as its first step ran it, and zero_grad's set_to_none as last called."""
    out: Seen = {}
    if shown.stepped:
        out["optimizer_fusion"] = (shown.stepped[0]["fusion"], why)
    if shown.zero_grads:
        out["set_to_none"] = (shown.zero_grads[-1], why)
    return out


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


def batch_and_lr(cfg: TrialConfig, shown: Shown, trial: api.Trial, job: ScriptJob) -> dict[str, Any]:
    """The script's accumulation, the global batch its ranks ran per step, the lr each optimizer was built
    with, and the lr rule: the study's, next to the one the optimizer that stepped follows."""
    out: dict[str, Any] = {}
    got, own = trial.returned, trial.defaults
    accumulation = got.get("accumulation", own.get("accumulation", job.own[1] if job.own else 1))
    built = shown.built[0] if shown.built else None
    if "lr" in got:
        before, after = own["lr"], got["lr"]
    else:
        before, after = (built["lr"], built["lr_set"]) if built else (None, None)
    if (arithmetic := trial.own_option_factor()) != 1 and before is not None:
        before /= arithmetic  # its own lr, at its own batch: what the study's rule scales from
    own_global = job.own[0] * job.own[1] if job.own is not None else None
    # The study's rule scaled its lr where the trial handed its batch over and its own lr is known.
    scaled = own_global is not None and "batch_size" in got and before is not None
    planned = cfg.global_batch_with(int(own.get("accumulation", job.own[1] if job.own else 1))) if scaled else None
    ran = shown.final.get("global_batch")
    out["global_batch"] = knob_effect(planned, ran, global_why(shown, trial, planned, ran))
    rule = lr_rule_record(cfg, job, shown.stepped[0]["type"] if shown.stepped else None)
    corrected = (built or {}).get("planned_for")
    if own_global is not None and planned is not None:
        lr_global = corrected["ran"] if corrected and "lr" not in got else planned
        out["lr"] = lr_effect(cfg, before, after, own_global, global_batch=lr_global) | {"rule": rule}
        if arithmetic != 1:
            out["lr"]["why"] += (
                f"; its own arithmetic gave {before * arithmetic:.4g} for {' '.join(trial.option_words())} (its lr "
                f"reads the option: x{arithmetic:.4g}), which the trial's factor divides out"
            )
        if corrected:
            out["lr"]["why"] += (
                f"; planned for global batch {corrected['global_batch']}, the ranks ran {corrected['ran']}"
                + (
                    f": at.lr() had handed the lr for {corrected['global_batch']} (the rule's factor for "
                    f"{corrected['ran']} is {corrected['rule_factor']:.4g})"
                    if "lr" in got
                    else ": set for the batch run before the first step"
                )
            )
    else:
        out["lr"] = knob_effect(before, after, "the script's own lr (its batch is its own)") | {"rule": rule}
    if built is not None and built.get("own_schedule"):
        out["lr"]["why"] += (
            "; "
            + OWN_SCHEDULE
            + (f": the trial scaled each value it set by {built['factor']:.4g}" if built["factor"] != 1 else "")
        )
    out["script"] = {"accumulation": accumulation, "optimizers_built": list(shown.built)}
    return out


def lr_rule_record(cfg: TrialConfig, job: ScriptJob, stepped: str | None) -> dict[str, Any]:
    """The lr rule the trial scaled by (the study's) and why, beside the optimizer that stepped: where that
    optimizer's family follows another rule (and the script's own lr arithmetic sets none), what to give."""
    rule: dict[str, Any] = {"rule": cfg.lr_scaling, "optimizer": stepped, "why": job.lr_rule_why}
    if cfg.lr_scaling != job.lr_rule:  # the user's --lr-scaling, over the rule read from the source
        rule["why"] = f"--lr-scaling {cfg.lr_scaling}, given (from the source: {job.lr_rule_why})"
    elif stepped is not None and rule_of(stepped) not in (None, cfg.lr_scaling) and not job.option_rule:
        rule["why"] += (
            f"; the optimizer that stepped is {stepped}, whose rule is {rule_of(stepped)}: "
            f"give --lr-scaling {rule_of(stepped)}"
        )
    return rule


def global_why(shown: Shown, trial: api.Trial, planned: int | None, ran: int | None) -> str:
    """What the global batch the ranks ran is made of, and, when it is not the one planned, that the
    script splits its batch over its ranks its own way."""
    world, per_rank = shown.final.get("world_size", 1), shown.final.get("samples_per_step_per_rank")
    said = f"{per_rank} sample(s) per optimizer step on each of {world} rank(s), summed"
    if not shown.samples:
        how = "handed over" if "batch_size" in trial.returned or not shown.fed else "fed to its model"
        said = f"no loader counted: {per_rank} {how} per step on each of {world} rank(s), summed"
    if planned is not None and ran is not None and ran != planned:
        said += (
            f"; the trial planned {planned} (the micro-batch x the accumulation it handed over, on every rank): "
            "the script splits its batch over its ranks its own way"
        )
    return said


def own_as_run(trial: api.Trial, shown: Shown) -> dict[str, Any] | None:
    """The script's own micro-batch and accumulation as this run handed them over: at.batch_size()'s and
    at.accumulation()'s defaults as the script passed them (a configurator or a config file has set
    them by then), else what its loaders delivered (samples per batch, batches per optimizer step);
    else, with no loader, the batch its model was fed x its backward passes per optimizer step;
    None when none shows one. A script that hands its batch over but accumulates on its own (no
    at.accumulation()) has its accumulation counted from its loaders: the batches per optimizer step."""
    own = trial.defaults
    samples, batches, fed, backwards = shown.samples, shown.batches, shown.fed, shown.backwards
    if "batch_size" in own:
        said = (
            "its DataLoader's batch_size as the run built it"
            if trial.through_loader
            else "at.batch_size()'s default as the run handed it over"
        )
        if "accumulation" in own:
            accumulation, said = (
                int(own["accumulation"]),
                "at.batch_size()'s and at.accumulation()'s defaults as the run handed them over",
            )
        elif batches:
            accumulation = batches
            said += f"; the accumulation: its loaders' {batches} batch(es) per optimizer step"
        else:
            accumulation = trial.own_accumulation
        return {"batch_size": int(own["batch_size"]), "accumulation": accumulation, "from": said}
    if not samples and fed:
        return {
            "batch_size": fed,
            "accumulation": max(1, backwards),
            "from": f"what its model was fed: {fed} a call, {max(1, backwards)} backward pass(es) per optimizer step",
        }
    if not samples or not batches or samples % batches:
        return None
    return {
        "batch_size": samples // batches,
        "accumulation": batches,
        "from": f"its loaders: {samples} sample(s) in {batches} batch(es) per optimizer step",
    }


def through(trial: api.Trial) -> str:
    """How the trial handed its micro-batch over."""
    if trial.option_words() and not trial.through_loader:
        return f"through its own option {' '.join(trial.option_words())} on its command line, no edit"
    if trial.option_words():
        return f"through its DataLoader's batch_size, given as its own option {' '.join(trial.option_words())}, no edit"
    return "through its DataLoader's batch_size, no edit" if trial.through_loader else "through at.batch_size()"


def throughput(trial: api.Trial, shown: Shown) -> dict[str, str]:
    """The unit the trial's figure counts: samples when its loaders delivered them or the script handed its
    batch over, else optimizer steps (the figure is then steps/s, and said so)."""
    if shown.samples:
        return {"unit": "samples/s", "why": "the samples its loaders delivered per optimizer step"}
    if "batch_size" in trial.returned:
        return {"unit": "samples/s", "why": "at.batch_size() as handed over x the backward passes of each step"}
    if shown.fed:
        return {"unit": "samples/s", "why": "the batch its model was fed x the backward passes of each step"}
    return {
        "unit": "steps/s",
        "why": "no loader delivered batches and the script hands over no batch (at.batch_size()): optimizer "
        "steps are counted, not samples",
    }


def data_order(shown: Shown, trial: api.Trial) -> str | None:
    """Where the trial's data seed reached the data this run trained on: at.data_seed() (a script that draws
    its batches itself), or a DataLoader that shuffles by its generator; None: nowhere, so parity's data-order
    twin would train on the baseline's own batches."""
    if "data_seed" in trial.calls:
        return "at.data_seed()"
    if shown.shuffled:
        return "a DataLoader that shuffles (the trial seeds its generator)"
    return None
