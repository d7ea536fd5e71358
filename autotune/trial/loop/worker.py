"""The trial worker: one config, one isolated process (per rank), one honest measurement.

Reads top to bottom: config -> pipeline -> knobs -> warm-up -> timed steps -> result.json.
Never imports optuna. Exit codes: 0 ok, 2 bad config or a dataset item that cannot be loaded
(status "data"), 3 out of memory, 4 non-finite loss, 5 knob unsupported here, 1 anything else
(traceback in the log).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from autotune.core.errors import ExitCode, exit_code_for
from autotune.core.files import write_json_atomic
from autotune.core.procs import die_with_parent, exit_now
from autotune.pipelines.frameworks import is_framework
from autotune.pipelines.script import is_script
from autotune.trial.measurement.contention import OtherCpu

LAUNCH_TIME_ENV = "AUTOTUNE_LAUNCH_TIME"
UTIL_INTERVAL_S = 0.1  # NVML utilisation is read this often during the timed steps


def run(cfg: Any, progress: Path | None = None, profile_out: Path | None = None) -> Any:
    """One trial: the loop that trains `cfg` (a framework's, the user's script, or autotune's own over a
    Pipeline), measured from `launched`, the moment its process was asked for."""
    launched = float(os.environ.get(LAUNCH_TIME_ENV, 0)) or _process_start_time()
    if is_framework(cfg.pipeline):  # Lightning / HF: the framework's own loop, measured by its callback
        from autotune.trial.loop.frameworks import run as run_framework

        return run_framework(cfg, progress, launched)
    if is_script(cfg.pipeline):  # the user's own script, run as written, measured through torch's hooks
        from autotune.trial.loop.script import run as run_script

        return run_script(cfg, progress, launched)
    return _run_pipeline(cfg, progress, profile_out, launched)


def _run_pipeline(cfg: Any, progress: Path | None, profile_out: Path | None, launched: float) -> Any:
    """autotune's own loop over a Pipeline: build, warm up, time the steps, gather over ranks."""
    import torch

    from autotune.core.config import TrialResult
    from autotune.trial.measurement import measure, observe
    from autotune.trial.loop.harness import build

    h = build(cfg, endless=True)  # one loader iterator for the whole trial: no restart between epochs
    memory_total = measure.memory_total_bytes(h.device)  # before the trial grows: RAM it may still take
    device, world = h.device, h.world
    stream = h.batches()
    startup_s = time.time() - launched
    losses: list[float] = []
    first_conv, warmup_s = _warm_up(cfg, h, stream, losses)
    measure.reset_peak_memory(device)
    timed = _timed_steps(cfg, h, stream, losses, progress)

    elapsed = timed.elapsed
    samples = len(timed.step_times) * cfg.batch_size * cfg.grad_accum  # samples, so accumulation compares fairly
    peak = measure.peak_memory_bytes(device)
    if world > 1:  # global throughput: all ranks' samples over the slowest rank's time
        elapsed, peak, warmup_s = _max_over_ranks(device, elapsed, peak, warmup_s)
        samples *= world
    losses = h.mean_over_ranks(losses)
    h.applied["observed"] = observe.after_steps(h, stream, first_conv, timed.util)
    gpu_util, util_errors = _util_over_ranks(timed.util, device, world)

    if profile_out is not None:  # every rank steps (DDP's all-reduce needs them all); rank 0 writes
        _profile(h.step, stream, profile_out if h.rank == 0 else None)

    return TrialResult(
        status="ok",
        samples_per_s=samples / elapsed,
        step_time_p50=measure.percentile(timed.step_times, 0.5),
        step_time_p90=measure.percentile(timed.step_times, 0.9),
        data_wait_fraction=sum(timed.waits) / sum(timed.step_times),
        peak_memory_bytes=peak,
        gpu_util=gpu_util,
        gpu_util_errors=util_errors,
        gpu_util_error=timed.util.first_error,
        others_cpu=timed.others.cpus,
        loss_first=losses[0],
        loss_last=losses[-1],
        losses=tuple(losses),
        memory_total_bytes=memory_total,
        startup_s=startup_s,
        warmup_s=warmup_s,
        timed_steps=len(timed.step_times),
        world_size=world,
        device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        windows=tuple(timed.windows),
        applied=h.applied,
    )


def _warm_up(cfg: Any, h: Any, stream: Iterator[Any], losses: list[float]) -> tuple[Any, float]:
    """Warm-up: allocator, cudnn autotune, loader start-up, and torch.compile's compilation, which is
    reported (warmup_s) apart from the steady state, and kept out of the timed window. Returns the
    first-conv observer (open for the first step only, which is untimed) and warmup_s."""
    from autotune.trial.measurement import measure, observe

    step, device = h.step, h.device
    first_conv = observe.FirstConv(h.model)
    t_warm = measure.now(device)
    for i in range(cfg.warmup_steps):
        losses.append(step(next(stream)))
        if i == 0:
            first_conv.close()
    drain = _drain_steps(cfg, h.loader)
    if drain and h.rank == 0:
        print(f"autotune trial: {drain} more warm-up step(s): {_ahead_why(h.loader)}", file=sys.stderr, flush=True)
    for _ in range(drain):
        losses.append(step(next(stream)))
    warmup_s = measure.now(device) - t_warm
    first_conv.close()  # no warm-up: the hook is gone before the timed steps either way
    return first_conv, warmup_s


@dataclass
class _Timed:
    """What the timed steps measured on this rank."""

    step_times: list[float]
    waits: list[float]  # time blocked on the loader, inside each step
    windows: list[float]  # samples/s per window of cfg.window steps, for pruning
    elapsed: float
    util: Any  # measure.GpuUtilSampler, closed
    others: Any  # contention.OtherCpu, closed


def _timed_steps(cfg: Any, h: Any, stream: Iterator[Any], losses: list[float], progress: Path | None) -> _Timed:
    """Steps until cfg's time box (or step count) is spent, each timed end to end, loader wait included."""
    from autotune.trial.measurement import measure

    step, device, rank, world = h.step, h.device, h.rank, h.world
    step_times: list[float] = []
    waits: list[float] = []
    windows: list[float] = []
    with measure.GpuUtilSampler(device, UTIL_INTERVAL_S) as util, OtherCpu() as others:
        t_begin = window_start = measure.now(device)
        while True:
            t0 = measure.now(device)
            batch = next(stream)  # end-to-end: time blocked on the loader is part of the step
            waits.append(time.perf_counter() - t0)
            losses.append(step(batch))
            step_times.append(measure.now(device) - t0)
            n = len(step_times)
            if n % cfg.window == 0:
                t = time.perf_counter()
                windows.append(cfg.window * cfg.batch_size * cfg.grad_accum * world / (t - window_start))
                window_start = t
                if rank == 0 and progress is not None:
                    with progress.open("a") as f:
                        f.write(json.dumps({"step": n, "samples_per_s": windows[-1]}) + "\n")
            if _finished(cfg, n, time.perf_counter() - t_begin, world, device):
                break
        elapsed = measure.now(device) - t_begin
    _say_why_no_util(util, device, elapsed)
    return _Timed(step_times, waits, windows, elapsed, util, others)


def _say_why_no_util(util: Any, device: Any, elapsed: float) -> None:
    """A GPU sampled without an NVML error and still no sample: the timed steps ended before the
    sampler's first read. Said in its first_error, so a missing utilisation is never silent."""
    if device.type == "cuda" and util.mean is None and util.first_error is None:
        util.first_error = (
            f"no utilisation sample: the timed steps took {elapsed:.2f} s, less than NVML's {UTIL_INTERVAL_S} s "
            "sampling interval (time more steps or seconds)"
        )


def _drain_steps(cfg: Any, loader: Any) -> int:
    """Warm-up steps that consume the batches the loader made ahead: a DataLoader keeps num_workers x
    prefetch_factor batches in flight, made while the first steps were slow (cuDNN autotuning,
    compilation). Timed, they would come free and overstate a loader-bound config; consumed before the
    clock starts, the window times the workers' steady rate. None without a warm-up: parity and time to
    target record a loss for exactly their steps from the first one, not a speed."""
    if cfg.warmup_steps == 0:
        return 0
    return -(-_made_ahead(loader) // cfg.grad_accum)  # each step takes grad_accum batches


def _made_ahead(loader: Any) -> int:
    return int(getattr(loader, "num_workers", 0) or 0) * int(getattr(loader, "prefetch_factor", 0) or 0)


def _ahead_why(loader: Any) -> str:
    return (
        f"the loader keeps {_made_ahead(loader)} batches made ahead ({loader.num_workers} workers x prefetch "
        f"{loader.prefetch_factor}), consumed before the clock starts so that the window times the workers"
    )


def _max_over_ranks(device: Any, elapsed: float, peak: int, warmup_s: float) -> tuple[float, int, float]:
    """The slowest rank's elapsed and warm-up time, and the fullest device's peak memory."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([elapsed, float(_device_peak(device, peak)), warmup_s], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0]), int(t[1]), float(t[2])


def _device_peak(device: Any, peak: int) -> int:
    """What this rank's GPU held at its peak. Ranks sharing a GPU (AUTOTUNE_DDP_BACKEND=gloo, or two
    nodes' ranks on one machine) each have a caching allocator of their own, and the device holds them
    all: their peaks add up (the ranks step in lockstep, so the peaks coincide). A GPU is known by its
    UUID (where each rank sees only its own GPU, they are all cuda:0), else by host and index. A CPU rank
    keeps its own RSS, held against the RAM it could take (measure.memory_total_bytes)."""
    if device.type != "cuda":
        return peak
    import socket

    import torch
    import torch.distributed as dist

    try:
        gpu = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # a torch without .uuid
        gpu = ""
    mine = gpu or f"{socket.gethostname()}:{device.index}"
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, (mine, peak))
    return sum(p for key, p in ranks if key == mine)


def _util_over_ranks(util: Any, device: Any, world: int) -> tuple[float | None, int]:
    """GPU utilisation and its read errors; with several ranks, each sampled its own GPU: the mean over
    the ranks that got samples, and the errors summed."""
    gpu_util, util_errors = util.mean, util.errors
    if world > 1:
        import torch
        import torch.distributed as dist

        u = torch.tensor(
            [gpu_util or 0.0, float(gpu_util is not None), float(util_errors)], dtype=torch.float64, device=device
        )
        dist.all_reduce(u)  # SUM
        gpu_util = float(u[0] / u[1]) if u[1] else None
        util_errors = int(u[2])
    return gpu_util, util_errors


def _finished(cfg: Any, n: int, elapsed: float, world: int, device: Any) -> bool:
    if cfg.seconds is None:
        return n >= cfg.timed_steps
    done = n >= cfg.window and elapsed >= cfg.seconds
    if world > 1:  # ranks must agree on the step count or the last all-reduce hangs
        import torch
        import torch.distributed as dist

        flag = torch.tensor([float(done)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        done = bool(flag.item())
    return done


def _profile(step: Any, stream: Iterator[Any], out: Path | None) -> None:
    """A few extra steps under torch.profiler, after the timed region so it can't skew it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step(next(stream))
    if out is None:
        return
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    out.write_text(prof.key_averages().table(sort_by=key, row_limit=25))


def _process_start_time() -> float:
    import psutil

    return psutil.Process().create_time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.trial", description="Run one trial worker (one rank).")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--progress", type=Path, default=None)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    from autotune.core.configfile import load_config
    from autotune.trial.loop.outcome import TRACEBACK_WORTHY, status_of

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    # Rank 0 owns result.json; another rank that fails leaves its own verdict beside it.
    out = args.out if rank == 0 else args.out.with_name(f"{args.out.name}.rank{rank}")

    def fail(status: str, message: str) -> int:
        write_json_atomic(out, {"status": status, "message": message})
        print(f"autotune trial: {status}: {message}", file=sys.stderr)
        code = exit_code_for(status)
        if world > 1:
            exit_now(code)
        return code

    try:
        cfg = load_config(args.config)
        if args.profile:
            cfg = cfg.replace(profile=True)
        result = run(cfg, args.progress, args.out.with_name("profile.txt") if cfg.profile else None)
    except Exception as e:
        status, message = status_of(e)
        if status in TRACEBACK_WORTHY:
            traceback.print_exc()  # kept in the trial log (a data item's own, and a loader worker's, too)
        return fail(status, message)
    if rank == 0:
        write_json_atomic(args.out, result.to_dict())
        print(
            f"autotune trial: {result.samples_per_s:.2f} samples/s, step p50 {result.step_time_p50 * 1000:.0f} ms, "
            f"data wait {result.data_wait_fraction:.0%}, peak {result.peak_memory_bytes / 2**20:.0f} MiB"
        )
    _shutdown()
    return ExitCode.OK


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # A rank that tears gloo down while a peer is still using the group can abort ("terminate
        # called without an active exception"), failing a trial that succeeded: wait for everyone.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
