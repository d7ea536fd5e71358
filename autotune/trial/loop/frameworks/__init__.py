"""A framework pipeline's trial: the framework's own loop (Lightning's Trainer.fit, transformers'
Trainer.train), measured by a callback the way autotune.trial.loop.worker measures its own loop.

The callback drives a `Clock`: the device synchronized before every clock read, warm-up steps untimed,
the time blocked on the loader counted inside each step, peak memory from the first timed step,
throughput per window (progress.jsonl, for pruning), and every optimizer step's loss, warm-up included.
The result is the worker's TrialResult, so the search, parity and time to target read it unchanged.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial; the frameworks lazily.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.core.config import KNOBS, TrialConfig, TrialResult
from autotune.core.errors import ConfigError, TrialUnsupported
from autotune.pipelines import load_pipeline
from autotune.pipelines.frameworks import FrameworkJob, knob_effect, lr_scale
from autotune.trial.loop import knobs
from autotune.trial.measurement import measure
from autotune.trial.measurement.contention import OtherCpu
from autotune.trial.loop.harness import NonFiniteLoss

# max_steps for a time-boxed trial: the callback stops it; a framework needs some number.
FOREVER = 10**9


class Clock:
    """The worker's measurement of one trial, fed by a framework's callback hooks:

    begin()      training starts (loader and model ready): start-up ends here
    fetched()    the loop holds its next batch (HF: a step's batches): the wait on the loader ends
    computed()   a micro-batch finished without an optimizer step: the loader is waited on again
    step_end()   an optimizer step finished; True when the trial has measured enough
    loss(x)      that step's loss, when the framework hands it over after step_end (HF's on_log)
    close()      training ended: the timed window closes if it is still open
    """

    def __init__(
        self, cfg: TrialConfig, device: torch.device, rank: int, world: int, progress: Path | None, launched: float
    ) -> None:
        self.cfg, self.device, self.rank, self.world = cfg, device, rank, world
        self.progress, self.launched = progress, launched
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.windows: list[float] = []
        self.steps = 0  # optimizer steps, warm-up included
        self.wait = 0.0  # this step's time blocked on the loader so far
        self.mark = self.step_start = self.started = 0.0
        self.t_begin: float | None = None  # the timed window's start
        self.window_start = 0.0
        self.startup_s = self.warmup_s = 0.0
        self.elapsed: float | None = None
        self.peak = 0
        # Samples in one optimizer step: the config's; a script trial sets what its own loader delivers.
        self.samples_per_step: float = cfg.batch_size * cfg.grad_accum
        self._util: measure.GpuUtilSampler | None = None
        self._others: OtherCpu | None = None

    def begin(self) -> None:
        self.startup_s = time.time() - self.launched
        self.started = self.mark = self.step_start = measure.now(self.device)
        if self.cfg.warmup_steps == 0:
            self._start_timing(self.started)

    def fetched(self) -> None:
        self.wait += time.perf_counter() - self.mark

    def computed(self) -> None:
        self.mark = measure.now(self.device)

    def step_end(self, loss: float | None = None) -> bool:
        t = measure.now(self.device)
        self.steps += 1
        if loss is not None:
            self.loss(loss)
        timed = self.t_begin is not None and self.elapsed is None
        if timed:
            self.step_times.append(t - self.step_start)
            self.waits.append(self.wait)
            self._window(t)
        self.step_start = self.mark = t
        self.wait = 0.0
        if self.t_begin is None and self.steps == self.cfg.warmup_steps:
            self.warmup_s = t - self.started
            self._start_timing(t)
        if timed and self._finished(t):
            self._stop(t)
            return True
        return False

    def loss(self, value: float) -> None:
        self.losses.append(float(value))
        if not math.isfinite(self.losses[-1]):
            raise NonFiniteLoss(f"loss became {value}")

    def idle(self) -> None:
        """The framework's own bookkeeping after a step (HF's logging) is not a wait on the loader."""
        self.mark = time.perf_counter()

    def close(self, losses_per_rank: bool) -> None:
        """At the end of training, while the framework's process group still exists: reduce over ranks.
        losses_per_rank: each rank recorded its own shard's loss (Lightning), averaged here."""
        if self.t_begin is not None and self.elapsed is None:
            self._stop(measure.now(self.device))
        if self.world == 1 or not torch.distributed.is_initialized():
            return
        dist = torch.distributed
        t = torch.tensor(
            [self.elapsed or 0.0, float(self.peak), self.warmup_s], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, the largest peak
        self.elapsed, self.peak, self.warmup_s = float(t[0]), int(t[1]), float(t[2])
        if losses_per_rank and self.losses:
            t = torch.tensor(self.losses, dtype=torch.float64, device=self.device)
            dist.all_reduce(t)  # SUM: gloo has no AVG
            self.losses = (t / self.world).tolist()

    def _start_timing(self, t: float) -> None:
        measure.reset_peak_memory(self.device)
        self._util = measure.GpuUtilSampler(self.device).__enter__()
        self._others = OtherCpu().__enter__()
        self.t_begin = self.window_start = t

    def _stop(self, t: float) -> None:
        assert self.t_begin is not None
        self.elapsed = t - self.t_begin
        self.peak = measure.peak_memory_bytes(self.device)
        for ctx in (self._util, self._others):
            if ctx is not None:
                ctx.__exit__(None, None, None)

    def _window(self, t: float) -> None:
        n, cfg = len(self.step_times), self.cfg
        if n % cfg.window:
            return
        self.windows.append(cfg.window * self.samples_per_step * self.world / (t - self.window_start))
        self.window_start = t
        if self.rank == 0 and self.progress is not None:
            with self.progress.open("a") as f:
                f.write(json.dumps({"step": n, "samples_per_s": self.windows[-1]}) + "\n")

    def _finished(self, t: float) -> bool:
        n, cfg = len(self.step_times), self.cfg
        done = n >= cfg.timed_steps if cfg.seconds is None else n >= cfg.window and t - self.t_begin >= cfg.seconds  # type: ignore[operator]
        if self.world > 1 and torch.distributed.is_initialized():  # ranks must stop at the same step
            flag = torch.tensor([float(done)], device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            done = bool(flag.item())
        return done

    def result(self, applied: dict[str, Any], memory_total: int | None) -> TrialResult:
        if self.elapsed is None or not self.step_times:
            raise ConfigError(
                f"the framework's loop ended after {self.steps} optimizer step(s), before the "
                f"{self.cfg.warmup_steps} warm-up step(s) and a timed one; its dataset may be too small"
            )
        util, others = self._util, self._others
        samples = len(self.step_times) * self.samples_per_step * self.world
        device = self.device
        return TrialResult(
            status="ok",
            samples_per_s=samples / self.elapsed,
            step_time_p50=measure.percentile(self.step_times, 0.5),
            step_time_p90=measure.percentile(self.step_times, 0.9),
            data_wait_fraction=sum(self.waits) / sum(self.step_times),
            peak_memory_bytes=self.peak,
            gpu_util=util.mean if util else None,
            gpu_util_errors=util.errors if util else 0,
            gpu_util_error=util.first_error if util else None,
            others_cpu=others.cpus if others else None,
            loss_first=self.losses[0] if self.losses else None,
            loss_last=self.losses[-1] if self.losses else None,
            losses=tuple(self.losses),
            memory_total_bytes=memory_total,
            startup_s=self.startup_s,
            warmup_s=self.warmup_s,
            timed_steps=len(self.step_times),
            world_size=self.world,
            device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            windows=tuple(self.windows),
            applied=applied,
        )


def run(cfg: TrialConfig, progress: Path | None, launched: float) -> TrialResult:
    """One trial of a framework pipeline, in this process (one rank of torchrun when gpus > 1)."""
    rank, world, local_rank = knobs.dist_env()
    device = knobs.pick_device(local_rank)
    applied: dict[str, Any] = knobs.setup_process(cfg, device)
    seed_all(cfg.seed + rank)  # the factory builds the model: its initial weights follow the seed
    job = load_pipeline(cfg)
    assert isinstance(job, FrameworkJob)
    refuse_unsupported(cfg, job)
    memory_total = measure.memory_total_bytes(device)
    clock = Clock(cfg, device, rank, world, progress, launched)
    if job.library == "lightning":
        from autotune.trial.loop.frameworks.lightning import train
    else:
        from autotune.trial.loop.frameworks.hf import train  # type: ignore[assignment]
    with contextlib.ExitStack() as stack:
        # The framework's own files (HF's output_dir, Lightning's root dir): beside the progress file, or,
        # for a trial run in-process without one, in a folder removed afterwards.
        workdir = progress.parent if progress is not None else Path(stack.enter_context(_scratch()))
        applied |= train(cfg, job, clock, device, workdir)  # type: ignore[arg-type]  # the job matches the library just chosen
    if cfg.profile:
        applied["profile"] = {
            "requested": True,
            "in_effect": False,
            "why": "the framework owns the loop: profile it with its own profiler",
        }
    return clock.result(applied, memory_total)


def _scratch() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="autotune-trial-", ignore_cleanup_errors=True)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def refuse_unsupported(cfg: TrialConfig, job: FrameworkJob) -> None:
    """A knob the framework cannot express, asked for anyway (a hand-written config): exit 5, as a
    Pipeline's `unsupported` knob is, naming why."""
    default = TrialConfig()
    refused = [k for k in sorted(job.unsupported & set(KNOBS)) if getattr(cfg, k) != getattr(default, k)]
    if refused:
        raise TrialUnsupported(
            "the pipeline does not support: " + ", ".join(f"{k} ({job.unsupported.why[k]})" for k in refused)
        )
    if cfg.checkpoint_segments > len(job.stages):
        raise TrialUnsupported(
            f"checkpoint_segments={cfg.checkpoint_segments} but the pipeline declares "
            f"{len(job.stages)} stage(s) {list(job.stages)}"
        )


def unsupported_effects(cfg: TrialConfig, job: FrameworkJob) -> dict[str, Any]:
    """The knobs the framework cannot express, recorded at their default, with why."""
    return {k: knob_effect(getattr(cfg, k), getattr(cfg, k), job.unsupported.why[k]) for k in job.unsupported}


def lr_effect(cfg: TrialConfig, before: Any, after: Any, own_batch: int) -> dict[str, Any]:
    """The user's own lr, meant for its own global batch, and the lr the trial trained with."""
    if cfg.global_batch_size == own_batch or cfg.lr_scaling == "none":
        return knob_effect(before, after, f"the pipeline's own learning rate (its global batch {own_batch})")
    return knob_effect(
        before,
        after,
        f"the pipeline's own lr, meant for its global batch {own_batch}, x "
        f"{lr_scale(cfg, own_batch):.4g}: {cfg.lr_scaling} rule for global batch {cfg.global_batch_size}",
    )
