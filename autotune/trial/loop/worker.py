"""The trial worker: one config, one isolated process (per rank), one honest measurement.

Reads top to bottom: config -> pipeline -> knobs -> warm-up -> timed steps -> result.json.
Never imports optuna. Exit codes: 0 ok, 2 bad config or a dataset item that cannot be loaded
(status "data"), 3 out of memory, 4 non-finite loss, 5 knob unsupported here, 1 anything else
(traceback in the log).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Iterator, Mapping

from autotune.core.errors import ExitCode, exit_code_for
from autotune.core.files import write_json_atomic
from autotune.core.procs import die_with_parent, exit_now
from autotune.pipelines import kind_of

if TYPE_CHECKING:
    from autotune.trial.loop.harness import Harness
    from autotune.trial.measurement.clock import Clock
    from autotune.trial.measurement.observe import FirstConv

LAUNCH_TIME_ENV = "AUTOTUNE_LAUNCH_TIME"


def run(cfg: Any, progress: Path | None = None, profile_out: Path | None = None) -> Any:
    """One trial: the loop that trains `cfg` (a framework's, the user's script, or autotune's own over a
    Pipeline), measured from `launched`, the moment its process was asked for."""
    launched = float(os.environ.get(LAUNCH_TIME_ENV, 0)) or _process_start_time()
    loop = kind_of(cfg.pipeline).loop
    if loop == "trainer":  # Lightning / HF: the framework's own loop, its callback driving the clock
        from autotune.trial.loop.frameworks import run as run_framework

        return run_framework(cfg, progress, launched)
    if loop == "script":  # the user's own script, run as written, torch's hooks driving the clock
        from autotune.trial.loop.script.running import run as run_script

        return run_script(cfg, progress, launched)
    return _run_pipeline(cfg, progress, profile_out, launched)


def _run_pipeline(cfg: Any, progress: Path | None, profile_out: Path | None, launched: float) -> Any:
    """autotune's own loop over a Pipeline: build, then its steps drive the trial's Clock (warm-up, the
    drain of what the loader made ahead, the timed window), then what the knobs did is observed."""
    from autotune.trial.loop.harness import build
    from autotune.trial.measurement import measure, observe
    from autotune.trial.measurement.clock import Clock

    h = build(cfg, endless=True)  # one loader iterator for the whole trial: no restart between epochs
    memory_total = measure.memory_total_bytes(h.device)  # before the trial grows: RAM it may still take
    stream = h.batches()
    clock = Clock(cfg, h.device, h.rank, h.world, progress, launched)
    clock.loader(h.loader)
    first_conv = _warm_up(h, stream, clock)
    while not _step(h, stream, clock):  # the timed steps, until cfg's time box (or step count) is spent
        pass
    clock.close(losses_per_rank=True)
    h.applied["observed"] = observe.after_steps(h, stream, first_conv, clock.util)

    if profile_out is not None:  # every rank steps (DDP's all-reduce needs them all); rank 0 writes
        _profile(h.step, stream, profile_out if h.rank == 0 else None)
    return clock.result(h.applied, memory_total)


def _warm_up(h: Harness, stream: Iterator[Any], clock: Clock) -> FirstConv:
    """Warm-up: allocator, cudnn autotune, loader start-up, and torch.compile's compilation, which is
    reported (warmup_s) apart from the steady state, then the steps that consume what the loader made
    ahead meanwhile; none of them timed. Returns the first-conv observer (open for the first step only,
    which is untimed; closed at once without a warm-up)."""
    from autotune.trial.measurement import observe

    first_conv = observe.FirstConv(h.model)
    clock.begin()
    while clock.warming:
        _step(h, stream, clock)
        first_conv.close()
    first_conv.close()
    return first_conv


def _step(h: Harness, stream: Iterator[Any], clock: Clock) -> bool:
    """One optimizer step on the clock, end to end: the time blocked on the loader is part of it. True
    once the trial has measured enough."""
    clock.fetching()
    batch = next(stream)
    clock.fetched()
    return clock.step_end(h.step(batch))


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
            f"autotune trial: {result.samples_per_s:.2f} {unit_said(result.applied)}, step p50 {result.step_time_p50 * 1000:.0f} ms, "
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


def unit_said(applied: Mapping[str, Any]) -> str:
    """The unit the figure counts: samples/s, or steps/s where a script's trial counted no samples."""
    said = applied.get("throughput")
    return str(said.get("unit") or "samples/s") if isinstance(said, Mapping) else "samples/s"
