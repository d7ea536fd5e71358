"""Running the user's script in a trial's process: as written (runpy, with its own sys.argv and
`__name__ == "__main__"`), with the seams installed in torch, until the trial's window is measured
(`run`) or to its own end (`run_whole`, `autotune run`); the settings its at.* calls and the batch seams
read (`trial_of`: the model knobs it routes itself, the micro-batch, accumulation and lr scale handed over).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
import functools
import runpy
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch

from autotune.core.config import TrialConfig, lr_factor
from autotune.core.result import TrialResult
from autotune.core.effects import refuse_unsupported
from autotune.core.errors import ConfigError, TrialUnsupported, ExitCode
from autotune.pipelines import script
from autotune.pipelines.script import LOADER_KNOBS, NO_LOADER_RAN, ScriptJob, api
from autotune.trial.loop import knobs
from autotune.trial.loop.script.ranks import Ranks
from autotune.trial.loop.script.records import what_ran
from autotune.trial.loop.script.seams import Seams, installed
from autotune.trial.loop.script.shown import Shown
from autotune.trial.measurement import measure
from autotune.trial.measurement.clock import Clock, WindowOver


@contextlib.contextmanager
def as_main(job: ScriptJob, extra: list[str] | None = None) -> Iterator[None]:
    """sys.argv and sys.path[0] as `python script.py ARGS` has them (`extra` after ARGS: the last of an
    option wins in argparse), restored afterwards."""
    argv, path = sys.argv[:], sys.path[:]
    sys.argv = [job.path, *job.args, *(extra or [])]
    sys.path.insert(0, str(Path(job.path).parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path


def run(cfg: TrialConfig, progress: Path | None, launched: float) -> TrialResult:
    """One trial of a script pipeline: the script run until the trial's timed steps are done. Under torchrun
    a script that sets up its own process group runs its own DDP set-up (the clock's collectives run once
    it exists); for one that sets up none the trial sets it up first (trial/loop/script/ranks.py)."""
    return _run(cfg, progress, launched, whole=False)[0]


def run_whole(
    cfg: TrialConfig, launched: float, measured: Collection[tuple[str, int]] | None = None
) -> tuple[TrialResult, int]:
    """`autotune run`: the script trained to its own end (its epochs, no timed stop, no step limit) with
    `cfg` applied through the same seams a trial installs. The trial's window is measured as a trial
    measures it, and what was applied is read as a trial reads it; the script then trains on with the
    seams still installed and the clock idle; the loader knobs only at the `measured` DataLoaders (Seams).
    The result (that window's figures, the `applied` record of the whole run), and the script's exit code
    (its own sys.exit's; 0 when it ran to its end; 130 when Ctrl-C stopped it: the record is of the steps
    so far)."""
    return _run(cfg, None, launched, whole=True, measured=measured)


def _run(
    cfg: TrialConfig,
    progress: Path | None,
    launched: float,
    whole: bool,
    measured: Collection[tuple[str, int]] | None = None,
) -> tuple[TrialResult, int]:
    rank, world, local_rank = knobs.dist_env()
    machine = knobs.pick_device(local_rank)
    applied: dict[str, Any] = knobs.setup_process(cfg, machine)
    job = script.load(cfg)  # its --baseline was checked where the search loaded it (load_pipeline)
    refuse_unsupported(cfg, job.refused())
    if world != cfg.gpus:  # a rank count not realised is never measured as that many GPUs
        raise TrialUnsupported(f"gpus {cfg.gpus}: this process is one of {world} rank(s): run it under torchrun")
    as_written = cfg.is_baseline
    trial = trial_of(cfg, job, machine, as_written)
    handed = trial.option_words() if job.batch_option is not None else []
    if handed and job.own is not None:  # its batch handed over through its own option, recorded as handed
        trial.defaults["batch_size"], trial.returned["batch_size"] = job.own[0], cfg.batch_size

    def clock_for(device: torch.device) -> Clock:
        return Clock(cfg, device, rank, world, progress, launched, quiet=whole)  # a run is no trial: no trial's log

    ranks = Ranks(machine, rank, world)  # whose process group is decided as the script runs (ranks.py)
    own_lr = "lr" in job.uses.api
    seams = Seams(cfg, clock_for, as_written, trial, own_lr, machine, measured, job.routed, whole, ranks)
    finished, code = execute(job, seams, whole=whole)
    if whole and seams.clock is not None and not seams.final:  # it ended before the trial's window closed
        seams.finish()
    if not whole and (not finished or seams.clock is None):  # a part-measured run is not this config's speed
        need = f"{cfg.timed_steps} timed" if cfg.seconds is None else f"{cfg.seconds:g} s of timed"
        untimed = seams.clock.untimed_steps if seams.clock is not None else cfg.warmup_steps
        raise ConfigError(
            f"the script ended after {seams.hook_steps} optimizer step(s), before {untimed} warm-up "
            f"and {need} step(s): give it more steps in its arguments"
        )
    shown = seams.shown()
    refuse_unrealised(cfg, job, shown, handed, as_written)
    process = knobs.process_seen(cfg, machine)  # read back as set up: the script may have set its own
    applied |= what_ran(cfg, shown, process, trial, job, as_written)
    memory = measure.memory_total_bytes(seams.at)
    try:
        if seams.clock is None:
            raise ConfigError("the script ran no optimizer step")
        return seams.clock.result(applied, memory), code
    except ConfigError as e:
        if not whole:
            raise
        # A whole run shorter than a trial's window trained all the same: what it applied, unmeasured.
        return TrialResult(status="ok", applied=applied, memory_total_bytes=memory, message=str(e)), code
    finally:
        if whole:
            ranks.teardown()


def refuse_unrealised(cfg: TrialConfig, job: ScriptJob, shown: Shown, handed: list[str], as_written: bool) -> None:
    """Exit 5 for what the config asked and the run did not realise: a batch handed through the script's own
    option that its model was not fed, loader knobs where the run (as the source guessed) built no DataLoader."""
    if handed and shown.fed != cfg.batch_size:  # the option must move the batch its model is fed
        fed = "nothing the trial could count" if shown.fed is None else f"batches of {shown.fed}"
        raise TrialUnsupported(
            f"batch_size {cfg.batch_size}: handed over as {' '.join(handed)}, but its model was fed {fed}: "
            "that option does not set the batch it trains on"
        )
    if shown.loaders or as_written:
        return
    changed = [k for k in sorted(job.guessed) if k in LOADER_KNOBS and k in cfg.changed]
    if changed:  # the source's guess, and the run agreed: no DataLoader to give them to
        raise TrialUnsupported("the pipeline does not support: " + ", ".join(f"{k} ({NO_LOADER_RAN})" for k in changed))


def trial_of(cfg: TrialConfig, job: ScriptJob, machine: torch.device, as_written: bool) -> api.Trial:
    """The settings the script's at.* calls and the batch seams read in this process."""
    return api.Trial(
        precision=cfg.precision,
        compile=cfg.compile,
        shaping=tuple(
            functools.partial(k.to_model, cfg=cfg) for k in knobs.routed_through("model", knobs.BEFORE_PARALLEL)
        ),
        wrapping=tuple(
            functools.partial(k.to_model, cfg=cfg) for k in knobs.routed_through("model", knobs.AFTER_PARALLEL)
        ),
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        device_type=machine.type,
        as_written=as_written,
        **batch_handover(cfg, job),
    )


def batch_handover(cfg: TrialConfig, job: ScriptJob) -> dict[str, Any]:
    """What the batch seams (its DataLoaders', or at.batch_size() and at.accumulation()) and the lr scale hand
    the script: the config's micro-batch, and its micro-batches per step when the study fixes the global
    batch; nothing for a script whose batch is its own (no DataLoader and no at.batch_size(), or its own
    batch cannot be read yet)."""
    if job.own is None:
        return {}
    fixed = cfg.global_batch is not None

    def scale(own_batch: int, own_accum: int) -> float:
        # The user's lr is meant for the script's own global batch; the trial plans its own (global_batch_with).
        return lr_factor(cfg.global_batch_with(own_accum) / (own_batch * own_accum), cfg.lr_scaling)

    return {
        "batch_size": cfg.batch_size,
        "accumulation": cfg.grad_accum if fixed else None,
        "own_batch_size": job.own[0],
        "own_accumulation": job.own[1],
        "through_loader": job.through_loader,
        "batch_option": job.uses.own_value("loader_batch_option") if job.through_loader else job.batch_option,
        "lr_scale": scale,
        # What its own lr arithmetic puts on its lr for the batch given its option, against its own batch.
        "option_lr_scale": None if (rule := job.option_rule) is None else lambda b, own: lr_factor(b / own, rule),
    }


def execute(job: ScriptJob, seams: Seams, whole: bool = False) -> tuple[bool, int]:
    """Run the script with the seams and their trial installed (what the script's at.* calls read). Returns
    whether the trial stopped it after its timed steps (False: the script ended on its own first), and
    the script's exit code. A trial refuses a script that exits with an error before it measured enough;
    a whole run (`whole`) hands the script's exit code back instead."""
    api.install(seams.trial)
    try:
        with installed(seams), as_main(job, seams.trial.option_words()), seams.ranks.quiet():
            runpy.run_path(job.path, run_name="__main__")
    except WindowOver:
        return True, 0
    except SystemExit as e:  # the script's own sys.exit(), before the trial measured enough
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if code != 0 and not whole:
            raise ConfigError(
                f"the script exited with {e.code!r} after {seams.hook_steps} optimizer step(s); "
                "its own message is in the trial log"
            ) from None
        return False, code
    except KeyboardInterrupt:  # Ctrl-C: a whole run still records what it applied so far, and ends with 130
        if not whole:
            raise
        return False, ExitCode.INTERRUPTED
    finally:
        api.install(None)
    return False, 0
