"""A script pipeline's trial: the user's own script, run as written in this process (runpy, with its own
sys.argv and `__name__ == "__main__"`), with autotune's seams installed in torch before it starts.

No edit to the script:
  - DataLoader construction: the trial's num_workers, pin_memory, prefetch_factor, persistent_workers
    replace the script's own arguments (DataLoader.__init__ wrapped);
  - the optimizer's fused/foreach flags, set on its param groups before GradScaler or its first step sees
    it (GradScaler.unscale_/step wrapped, and a global step pre-hook): GradScaler picks its path by the
    optimizer's flags, so a flag switched inside step() would hand a foreach step a fused step's scale;
    zero_grad(set_to_none) on optimizers and modules; cudnn.benchmark and the thread count set before
    the script runs;
  - the lr for the trial's global batch: the lr each optimizer's constructor is given, scaled by the
    study's rule from the script's own global batch (Optimizer.__init__ wrapped, so a schedule built on
    it afterwards keeps its shape from the scaled lr); a script that calls at.lr() scales its own. The
    scale is planned for the handed-over micro-batch x accumulation on every rank; where the first step
    delivers another global batch (a script that divides its accumulation by the world size), the lr,
    and the schedules built on it, are set for the batch run before that step updates anything;
  - the data order: a config with a data seed (parity's data-order twin) hands each DataLoader a
    generator seeded with it; without one the script's own RNG decides, as it does alone;
  - measurement: the trial's one Clock (trial.measurement.clock), as every kind drives it, made when the
    script first fetches or steps, on the device its tensors live on (the model handed to at.model(), else
    its optimizer's parameters; the machine's without either): each loader the script starts iterating is
    told to it (what its workers make ahead is drained in the warm-up); a global optimizer-step post-hook
    ends each step; the time blocked in the DataLoader iterator's __next__, from a device sync, is the
    data wait; each backward()'s scalar (a copy: the script's tensor is not held) is the step's loss; the
    samples of a step are what its loaders delivered, else at.batch_size() x at.accumulation() as handed
    over. After the timed steps the hook closes the clock (its collectives run while the script's process
    group exists), reads what the run showed, and raises Done, which ends the script and is caught here.
  - gpus: a script that sets up its own process group runs under torchrun, one process per GPU (the
    launcher's, as for every kind); the trial sets up none itself, so the script's own DDP set-up runs
    untouched, and each rank runs these seams. The world size and the global batch (the samples every
    rank's loaders delivered per optimizer step, summed) are what the run showed.
  - the model its optimizer trains, with no edit (autotune.trial.loop.unedited): checkpoint_segments,
    channels_last and precision applied to it in place when it is first called, each observed, unless an
    at.* call routes the knob (at.autocast() precision, at.model() channels_last).
With the cooperative calls (autotune.script): at.batch_size() and at.accumulation() hand over the trial's
micro-batch and, under a study's global batch, its micro-batches per step; at.lr() the scaled lr;
at.autocast() and at.scaler() the trial's precision, on the model's device.
The baseline (a config equal to the study's baseline knobs) runs the script's own settings: nothing is
overridden (at.autocast(own) and at.scaler(own) run the script's own AMP), and what the script set is
recorded as observed. The seams are autotune.trial.loop.script_seams; what the trial reads from what they
saw (each knob's effect, the construction sites, the script's own batch, the throughput unit) is
autotune.trial.loop.script_records.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import torch

from autotune.core.config import TrialConfig, TrialResult
from autotune.core.effects import knob_effect, refuse_unsupported, unsupported_effects
from autotune.core.errors import ConfigError
from autotune.pipelines import load_pipeline
from autotune.pipelines.script import ScriptJob, api
from autotune.trial.loop import knobs
from autotune.trial.loop.script_records import (
    batch_and_lr,
    observed,
)
from autotune.trial.measurement import measure
from autotune.trial.measurement.clock import Clock
from autotune.trial.loop.script_seams import Seams, Done, batch_handover, installed, is_as_written


@contextlib.contextmanager
def as_main(job: ScriptJob) -> Iterator[None]:
    """sys.argv and sys.path[0] as `python script.py ARGS` has them, restored afterwards."""
    argv, path = sys.argv[:], sys.path[:]
    sys.argv = [job.path, *job.args]
    sys.path.insert(0, str(Path(job.path).parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, path


def run(cfg: TrialConfig, progress: Path | None, launched: float) -> TrialResult:
    """One trial of a script pipeline: the script run until the trial's timed steps are done. No process
    group is set up here: a script run under torchrun sets up its own, and the clock's collectives run
    only once it exists."""
    return _run(cfg, progress, launched, whole=False)[0]


def run_whole(
    cfg: TrialConfig, launched: float, measured: Collection[tuple[str, int]] | None = None
) -> tuple[TrialResult, int]:
    """`autotune run`: the script trained to its own end (its epochs, no timed stop, no step limit) with
    `cfg` applied through the same seams a trial installs. The trial's window is measured as a trial
    measures it, and what was applied is read as a trial reads it; the script then trains on with the
    seams still installed and the clock idle; the loader knobs only at the `measured` DataLoaders (Seams).
    The result (that window's figures, the `applied` record of the whole run), and the script's exit code
    (its own sys.exit's; 0 when it ran to its end)."""
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
    job = load_pipeline(cfg)
    assert isinstance(job, ScriptJob)
    refuse_unsupported(cfg, job.unsupported)
    as_written = is_as_written(cfg)
    trial = api.Trial(
        precision=cfg.precision,
        channels_last=cfg.channels_last,
        compile=cfg.compile,
        compile_backend=os.environ.get(knobs.COMPILE_BACKEND_ENV, "inductor"),
        seed=cfg.seed,
        data_seed=cfg.data_seed,
        device_type=machine.type,
        as_written=as_written,
        **batch_handover(cfg, job),
    )

    def clock_for(device: torch.device) -> Clock:
        clock = Clock(cfg, device, rank, world, progress, launched)
        return _Whole(clock, seams.finish) if whole else clock  # type: ignore[return-value]

    own_lr, routed = "lr" in job.uses.api, job.routed
    seams = Seams(cfg, clock_for, as_written, trial, own_lr, machine=machine, measured=measured, routed=routed)
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
    applied |= what_ran(cfg, seams, trial, job, as_written)
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


class _Whole:
    """A whole run's clock (`run_whole`): the trial's Clock until its window is measured, when `done`
    closes it and reads what the run showed (Seams.finish, as a trial's end does); idle afterwards, so
    the script trains on with no device sync and no clock read per step, and the figures stay the
    window's. It never asks the script to stop."""

    def __init__(self, clock: Clock, done: Callable[[], None]) -> None:
        object.__setattr__(self, "_clock", clock)
        object.__setattr__(self, "_done", done)
        object.__setattr__(self, "idle", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._clock, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if not self.idle:  # what the seams count after the window does not change its figures
            setattr(self._clock, name, value)

    def loader(self, loader: Any) -> None:
        if not self.idle:
            self._clock.loader(loader)

    def fetching(self) -> None:
        if not self.idle:
            self._clock.fetching()

    def fetched(self) -> None:
        if not self.idle:
            self._clock.fetched()

    def step_end(self, loss: float | None = None) -> bool:
        if not self.idle and self._clock.step_end(loss):
            self._done()
            object.__setattr__(self, "idle", True)
        return False

    def close(self, losses_per_rank: bool) -> None:
        if not self.idle:
            self._clock.close(losses_per_rank)


def execute(job: ScriptJob, seams: Seams, whole: bool = False) -> tuple[bool, int]:
    """Run the script with the seams and their trial installed (what the script's at.* calls read). Returns
    whether the trial stopped it after its timed steps (False: the script ended on its own first), and
    the script's exit code. A trial refuses a script that exits with an error before it measured enough;
    a whole run (`whole`) hands the script's exit code back instead."""
    api.install(seams.trial)
    try:
        with installed(seams), as_main(job):
            runpy.run_path(job.path, run_name="__main__")
    except Done:
        return True, 0
    except SystemExit as e:  # the script's own sys.exit(), before the trial measured enough
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if code != 0 and not whole:
            raise ConfigError(
                f"the script exited with {e.code!r} after {seams.hook_steps} optimizer step(s); "
                "its own message is in the trial log"
            ) from None
        return False, code
    finally:
        api.install(None)
    return False, 0
