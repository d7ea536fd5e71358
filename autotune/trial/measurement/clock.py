"""The one clock of every measured loop: whatever owns the loop (autotune's own steps, a Trainer's callback,
a script's optimizer hook, a probe's phase or its hook in a script run alone) tells it where a step is,
and it measures a trial the same way for every kind, and a probe's steps the way a trial's are.

What it owns:
  * the warm-up: steps untimed (allocator, cuDNN autotuning, compilation, loader start-up), then as many
    more as consume the batches the loaders made ahead meanwhile (num_workers x prefetch_factor each), so
    the timed window sees the workers' steady rate, not batches that came free;
  * the device synchronized before every read: a clock read without a sync times the launch, not the work;
  * the data wait: the time blocked on the loader, counted inside each step, from a synchronized mark, so
    kernels still running from the previous micro-batch are not taken for a wait on the loader;
  * each step's time, throughput per window (progress.jsonl, for pruning), and when the trial has measured
    enough (agreed over ranks: a rank that stopped alone would leave the others in an all-reduce): the
    decision to stop is the clock's (`over`; `raise_if_over` for a driver inside a loop it does not own);
  * the samples the loaders handed over during the timed steps, counted one way (samples.batch_len);
  * every optimizer step's loss, warm-up included (parity and time to target read them); a run that
    carries a check (`record`: TrialConfig.record_steps) goes on, untimed, after its window until it has
    that many, so the check reads them from the trial instead of a process of its own;
  * peak memory and GPU utilisation over the timed window, and other processes' CPU use meanwhile (a
    trial's meters; a probe's Span may leave them off);
  * the figures over ranks (the slowest rank's time, the device's peak, the mean utilisation) and the
    TrialResult.

A trial's clock times what its config says (warm-up, timed steps or seconds, windows); a probe's, a
`Span` (a fixed warm-up and timed steps or seconds, without the trial's meters: a probe's steps are
timed as a trial's are, and it reads the figures it needs). A driver calls, in this order:

    clock.loader(l)        each loader the job iterates, once known (before the warm-up ends)
    clock.begin()          the job is ready to step: start-up ends, the warm-up begins
    clock.fetching()       the loop turns to its loader (a step's start, or after a micro-batch)
    clock.fetched()        the loader handed over its batch, or a step's batches
    clock.delivered(b)     a batch the loader handed over, its samples counted (optional)
    clock.step_end(loss)   an optimizer step finished; True once the trial has measured enough
    clock.raise_if_over()  from a hook inside a loop the driver does not own: WindowOver ends it
    clock.loss(x)          a step's loss handed over after step_end (HF logs it then)
    clock.close(...)       the loop ended: the window closes, the figures are reduced over ranks
    clock.result(...)      the TrialResult (a probe reads seconds, timed_steps, waited_s, samples instead)

May import: autotune.core, and trial.measurement's instruments.
"""

from __future__ import annotations

import json
import math
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.core.config import TrialConfig, drain_steps
from autotune.core.result import TrialResult
from autotune.core.errors import ConfigError
from autotune.trial.measurement import measure
from autotune.trial.measurement.contention import OtherCpu
from autotune.trial.measurement.samples import batch_len

UTIL_INTERVAL_S = 0.1  # NVML utilisation is read this often during the timed steps


class NonFiniteLoss(Exception):
    """A step's loss became nan or inf: the config's numerics failed (exit 4)."""


class WindowOver(BaseException):
    """Raised by Clock.raise_if_over once the timed window is measured, to end a loop the driver does not
    own (a user's script, from a hook inside it): a BaseException, so the script's own `except Exception`
    lets it through."""


@dataclass(frozen=True)
class Span:
    """What a clock leaves untimed and what it times: `warmup` steps (then, for the loaders told to it,
    those that drain the batches they made ahead), then `steps` timed steps, or with `seconds` at least
    `steps` and until `seconds` have passed. `every`: steps per throughput window (0: none). `meters`: the
    peak memory (reset when the timed steps begin), NVML utilisation and other processes' CPU use over
    the timed steps; off, the clock only counts and times (a reset of the peak empties CUDA's cache,
    which a run that must run as written does not do). `record`: the optimizer steps, warm-up included,
    whose losses the run must record: it goes on, untimed, after its window until it has them (0: it stops
    with its window)."""

    warmup: int
    steps: int
    seconds: float | None = None
    every: int = 0
    meters: bool = True
    record: int = 0

    @classmethod
    def of(cls, cfg: TrialConfig) -> Span:
        """A trial's: its warm-up, its timed steps or, time-boxed, a window at least and its seconds."""
        steps = cfg.timed_steps if cfg.seconds is None else cfg.window
        return cls(cfg.warmup_steps, steps, cfg.seconds, cfg.window, meters=True, record=cfg.record_steps)


def _made_ahead(loader: Any) -> int:
    """Batches a DataLoader's workers keep in flight: num_workers x prefetch_factor (0 without workers)."""
    return int(getattr(loader, "num_workers", 0) or 0) * int(getattr(loader, "prefetch_factor", 0) or 0)


class Clock:
    """One measured run's clock (see the module's docstring for the calls, in order).

    cfg: a trial's config (Span.of reads what to time from it), or a probe's Span. launched: when the
    process started (time.time()), for the start-up's seconds; None: not counted.
    samples_per_step: the samples one optimizer step trains on, over all its micro-batches, on one rank:
    the config's (0 for a Span); a script's seams set what its loaders delivered. batches_per_step: the
    loader batches one step takes (the config's accumulation; a script's seams set what they counted),
    which the drain divides the batches made ahead by. quiet: say nothing on stderr (the extra warm-up
    steps a trial's log names): `autotune run` measures a trial's window on the way, and is no trial."""

    def __init__(
        self,
        cfg: TrialConfig | Span,
        device: torch.device,
        rank: int = 0,
        world: int = 1,
        progress: Path | None = None,
        launched: float | None = None,
        quiet: bool = False,
    ) -> None:
        self._span = cfg if isinstance(cfg, Span) else Span.of(cfg)
        self._device, self._rank, self._world = device, rank, world
        self._quiet = quiet
        self._progress, self._launched = progress, launched
        self.samples_per_step: float = 0.0 if isinstance(cfg, Span) else cfg.batch_size * cfg.grad_accum
        self.batches_per_step = 1 if isinstance(cfg, Span) else cfg.grad_accum
        self._losses: list[float] = []
        self._step_times: list[float] = []
        self._waits: list[float] = []  # time blocked on the loader, inside each timed step
        self._windows: list[float] = []  # samples/s per window of cfg.window steps
        self._steps = 0  # optimizer steps, warm-up included
        self._startup_s = self._warmup_s = 0.0
        self._elapsed: float | None = None  # the timed window's length, once closed
        self._closed_at = 0.0  # when the timed window closed
        self._record_s = 0.0  # after it, the untimed steps whose losses a check reads
        self._peak = 0
        self._gpu_util: float | None = None
        self._gpu_util_errors = 0
        self._loaders: list[Any] = []
        self._untimed: int | None = None  # warm-up steps with the drain, decided after the warm-up's own
        self._wait = 0.0  # this step's time blocked on the loader so far
        self._mark = self._step_start = self._started = 0.0
        self._t_begin: float | None = None  # the timed window's start
        self._window_start = 0.0
        self._util: measure.GpuUtilSampler | None = None
        self._others: OtherCpu | None = None
        self._over = False  # the window closed on its steps or seconds, the losses to record are in: it stops
        self._batches = 0  # told to `delivered`, since the clock was made
        self._pending = 0  # samples delivered since the last step's end (or begin)
        self._samples = 0  # samples delivered during the timed steps

    # ---- what the driver tells ----------------------------------------------------------------
    def loader(self, loader: Any) -> None:
        """A loader the job iterates. Its batches made ahead count toward the drain while the warm-up
        has not ended; the same loader told again (a new epoch's iterator) counts once."""
        if self._untimed is None and all(loader is not seen for seen in self._loaders):
            self._loaders.append(loader)

    def begin(self) -> None:
        """The job is ready to step (model, optimizer and loader built): start-up ends here."""
        self._startup_s = 0.0 if self._launched is None else time.time() - self._launched
        self._started = self._mark = self._step_start = measure.now(self._device)
        self._pending = 0  # what was delivered before the job was ready belongs to no step
        if self._span.warmup == 0:
            self._untimed = 0
            self._start_timing()

    def fetching(self) -> None:
        """The loop turns to its loader: the device is synchronized, and the wait is counted from here."""
        self._mark = measure.now(self._device)

    def fetched(self) -> None:
        """The loader handed over what the loop asked for: the wait since the mark is the step's (read
        without a sync: the wait is the host's, and the mark was synchronized)."""
        self._wait += time.perf_counter() - self._mark

    def delivered(self, batch: Any) -> None:
        """A batch a loader handed over: its samples (samples.batch_len) count toward the step it is
        trained in, and toward `samples` when that step is timed. Read without a sync: only counted."""
        self._batches += 1
        self._pending += batch_len(batch)

    def step_end(self, loss: float | None = None) -> bool:
        """An optimizer step finished (its loss, when the driver has it now). True once the trial has
        measured enough: the driver stops its loop."""
        t = measure.now(self._device)
        self._steps += 1
        if loss is not None:
            self.loss(loss)
        done = False
        if self._timing:
            self._step_times.append(t - self._step_start)
            self._waits.append(self._wait)
            self._samples += self._pending
            self._window(t)
            if self._finished(t):
                self._stop(measure.now(self._device))
                done = self._recorded()
        elif self.warming:
            if self._untimed is None and self._steps >= self._span.warmup:
                self._untimed = self._span.warmup + self._drain()
            if self._untimed is not None and self._steps >= self._untimed:
                self._warmup_s = t - self._started
                self._start_timing()
        elif not self._over:  # the window closed; the run goes on, untimed, for the losses a check reads
            done = self._recorded()
            self._record_s = t - self._closed_at
        self._over = self._over or done
        self._wait, self._pending = 0.0, 0
        self._step_start = self._mark = measure.now(self._device)  # the clock's own work is no step's
        return done

    def raise_if_over(self) -> None:
        """For a driver in a hook inside a loop it does not own: WindowOver once the window is measured."""
        if self._over:
            raise WindowOver

    def loss(self, value: float) -> None:
        """A step's loss. Raises NonFiniteLoss on nan or inf."""
        self._losses.append(float(value))
        if not math.isfinite(self._losses[-1]):
            raise NonFiniteLoss(f"loss became {value}")

    def close(self, losses_per_rank: bool) -> None:
        """The loop ended, while its process group still exists: the window closes if it is open, and the
        figures are reduced over ranks. losses_per_rank: each rank recorded its own shard's loss, 1/world of
        the global batch (autotune's own loop, Lightning), averaged here in one all-reduce."""
        if self._timing:
            self._stop(measure.now(self._device))
        if self._world == 1 or not dist.is_initialized():
            return
        t = torch.tensor(
            [self._elapsed or 0.0, float(_device_peak(self._device, self._peak)), self._warmup_s],
            dtype=torch.float64,
            device=self._device,
        )
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, the fullest device's peak
        self._elapsed, self._peak, self._warmup_s = float(t[0]), int(t[1]), float(t[2])
        # Each rank sampled its own GPU: the mean over the ranks that got samples, and the errors summed.
        u = torch.tensor(
            [self._gpu_util or 0.0, float(self._gpu_util is not None), float(self._gpu_util_errors)],
            dtype=torch.float64,
            device=self._device,
        )
        dist.all_reduce(u)  # SUM
        self._gpu_util, self._gpu_util_errors = (float(u[0] / u[1]) if u[1] else None), int(u[2])
        if losses_per_rank and self._losses:
            losses = torch.tensor(self._losses, dtype=torch.float64, device=self._device)
            dist.all_reduce(losses)  # SUM: gloo has no AVG
            self._losses = (losses / self._world).tolist()

    # ---- what the driver reads ----------------------------------------------------------------
    @property
    def warming(self) -> bool:
        """Still in the warm-up: the timed window has not opened."""
        return self._t_begin is None

    @property
    def over(self) -> bool:
        """The timed window closed on its steps or seconds: the run has measured enough, the loop stops."""
        return self._over

    @property
    def untimed_steps(self) -> int:
        """The warm-up's steps: the config's, and once they are done, those that drain what the loaders
        made ahead."""
        return self._span.warmup if self._untimed is None else self._untimed

    @property
    def seconds(self) -> float | None:
        """The timed window's length (from its start, synchronized, to its close), once closed."""
        return self._elapsed

    @property
    def timed_steps(self) -> int:
        """The optimizer steps timed so far."""
        return len(self._step_times)

    @property
    def waited_s(self) -> float:
        """The time the timed steps spent blocked on the loader (told by fetching and fetched)."""
        return sum(self._waits)

    @property
    def samples(self) -> int | None:
        """The samples the timed steps trained on, as `delivered` counted them; None where no batch was
        told to it (a job whose batches come from no loader the driver sees)."""
        return self._samples if self._batches else None

    @property
    def util(self) -> measure.GpuUtilSampler | None:
        """The timed window's NVML sampler (closed once the window is): which GPU it read, its pids."""
        return self._util

    def result(self, applied: dict[str, Any], memory_total: int | None) -> TrialResult:
        """The trial's result, once the loop is closed. A loop that ended before a timed step is bad input."""
        if self._elapsed is None or not self._step_times:
            raise ConfigError(
                f"the loop ended after {self._steps} optimizer step(s), before the {self.untimed_steps} "
                "warm-up step(s) and a timed one; its dataset may be too small"
            )
        util, others, device = self._util, self._others, self._device
        return TrialResult(
            status="ok",
            samples_per_s=len(self._step_times) * self.samples_per_step * self._world / self._elapsed,
            step_time_p50=measure.percentile(self._step_times, 0.5),
            step_time_p90=measure.percentile(self._step_times, 0.9),
            data_wait_fraction=sum(self._waits) / sum(self._step_times),
            peak_memory_bytes=self._peak,
            gpu_util=self._gpu_util,
            gpu_util_errors=self._gpu_util_errors,
            gpu_util_error=util.first_error if util else None,
            others_cpu=others.cpus if others else None,
            loss_first=self._losses[0] if self._losses else None,
            loss_last=self._losses[-1] if self._losses else None,
            losses=tuple(self._losses),
            memory_total_bytes=memory_total,
            startup_s=self._startup_s,
            warmup_s=self._warmup_s,
            record_s=self._record_s,
            timed_steps=len(self._step_times),
            world_size=self._world,
            device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            windows=tuple(self._windows),
            applied=applied,
        )

    # ---- inside -------------------------------------------------------------------------------
    @property
    def _timing(self) -> bool:
        return self._t_begin is not None and self._elapsed is None

    def _drain(self) -> int:
        """Decided once the warm-up's own steps are done: the loaders are known, and so is a step's take."""
        ahead = sum(_made_ahead(loader) for loader in self._loaders)
        drain = drain_steps(ahead, self.batches_per_step, self._span.warmup)
        if drain and self._rank == 0 and not self._quiet:
            print(
                f"autotune trial: {drain} more warm-up step(s): {_ahead_why(self._loaders)}",
                file=sys.stderr,
                flush=True,
            )
        return drain

    def _start_timing(self) -> None:
        if self._span.meters:
            measure.reset_peak_memory(self._device)  # the peak of the timed steps, not of the warm-up's workspaces
            self._util = measure.GpuUtilSampler(self._device, UTIL_INTERVAL_S).__enter__()
            self._others = OtherCpu().__enter__()
        self._t_begin = self._window_start = self._step_start = measure.now(self._device)

    def _stop(self, t: float) -> None:
        assert self._t_begin is not None
        self._elapsed, self._closed_at = t - self._t_begin, t
        if self._span.meters:
            self._peak = measure.peak_memory_bytes(self._device)
        for ctx in (self._util, self._others):
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if self._util is not None:
            _say_why_no_util(self._util, self._device, self._elapsed)
            self._gpu_util, self._gpu_util_errors = self._util.mean, self._util.errors

    def _window(self, t: float) -> None:
        n, every = len(self._step_times), self._span.every
        if not every or n % every:
            return
        took = t - self._window_start
        self._windows.append(every * self.samples_per_step * self._world / took)
        self._window_start = t
        if self._rank == 0 and self._progress is not None:
            with self._progress.open("a") as f:
                f.write(json.dumps({"step": n, "samples_per_s": self._windows[-1], "seconds": took}) + "\n")

    def _recorded(self) -> bool:
        """Every loss the run must record is in: its steps are counted alike on every rank, so no rank stops
        alone."""
        return self._steps >= self._span.record

    def _finished(self, t: float) -> bool:
        assert self._t_begin is not None
        n, span = len(self._step_times), self._span
        if span.seconds is None:
            return n >= span.steps
        done = n >= span.steps and t - self._t_begin >= span.seconds
        if self._world > 1 and dist.is_initialized():  # ranks agree on the step count, or one waits in an all-reduce
            flag = torch.tensor([float(done)], device=self._device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            done = bool(flag.item())
        return done


def _ahead_why(loaders: list[Any]) -> str:
    busy = [loader for loader in loaders if _made_ahead(loader)]
    each = ", ".join(f"{loader.num_workers} workers x prefetch {loader.prefetch_factor}" for loader in busy)
    keeps = "the loader keeps" if len(busy) == 1 else f"the {len(busy)} loaders keep"
    return (
        f"{keeps} {sum(map(_made_ahead, busy))} batches made ahead ({each}), consumed before the clock starts "
        "so that the window times the workers"
    )


def _say_why_no_util(util: measure.GpuUtilSampler, device: torch.device, elapsed: float) -> None:
    """A GPU sampled without an NVML error and still no sample: the timed steps ended before the
    sampler's first read. Said in its first_error, so a missing utilisation is never silent."""
    if device.type == "cuda" and util.mean is None and util.first_error is None:
        util.first_error = (
            f"no utilisation sample: the timed steps took {elapsed:.2f} s, less than NVML's {UTIL_INTERVAL_S} s "
            "sampling interval (time more steps or seconds)"
        )


def _device_peak(device: torch.device, peak: int) -> int:
    """What this rank's GPU held at its peak. Ranks sharing a GPU (AUTOTUNE_DDP_BACKEND=gloo, or two
    nodes' ranks on one machine) each have a caching allocator of their own, and the device holds them
    all: their peaks add up (the ranks step in lockstep, so the peaks coincide). A GPU is known by its
    UUID (where each rank sees only its own GPU, they are all cuda:0), else by host and index. A CPU rank
    keeps its own RSS, held against the RAM it could take (measure.memory_total_bytes)."""
    if device.type != "cuda":
        return peak
    try:
        gpu = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # a torch without .uuid
        gpu = ""
    mine = gpu or f"{socket.gethostname()}:{device.index}"
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (mine, peak))
    return sum(p for key, p in ranks if key == mine)
