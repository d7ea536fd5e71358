"""How far a config is from the limit: its data-bound ceiling and its model FLOPs utilisation, measured
in a process of its own.

`python -m autotune.trial.probes.ceiling --config cfg.json --out ceiling.json` builds the config exactly as a
trial does (`harness.build`) and, in one process:

  end-to-end     h.step on batches from the config's DataLoader, the data wait counted inside the step
  compute only   h.step on a few batches taken from that loader once and cycled (same shapes, same knobs,
                 same to_device copy inside the step): only the loader's cost is missing, so its rate is
                 the ceiling that a faster input pipeline could reach (benchmarks/roofline.py's question)
  FLOPs          `torch.utils.flop_counter.FlopCounterMode` over one step (forward, backward, optimizer)
  peak           a square matmul at the precision the step computes in, timed on the same device and
                 threads: what this device sustains on the op the FLOP count counts

The two phases run in ROUNDS rounds, alternating which goes first, and each rate is the median of its
rounds. Each phase is timed by a Clock of its own (trial.measurement.clock, the one trials drive), with
a Span of its warm-up and at least MIN_STEPS steps and PHASE_S seconds: its warm-up, the sync before
every read and the data wait inside each step are the trial's. The share lost to data wait is 1 -
end-to-end / compute only, both from this process seconds apart (a process's own speed moves ~10% on a
shared VM, so two processes would not compare). The utilisation is FLOPs per sample x samples/s over the
probed peak. `timed_steps` and `warm_up` are the measuring code benchmarks/roofline.py shares.

May import: autotune.core, autotune.pipelines, trial.processes, trial.loop and trial.measurement.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from autotune.core.config import TrialConfig
from autotune.core.procs import die_with_parent
from autotune.pipelines import kind_of

CACHED_BATCHES = 2  # steps' worth of batches cycled by the compute-only phase
ROUNDS = 2  # of (end-to-end, compute only): a process's speed drifts, so each goes first once
MIN_STEPS = 2  # timed steps per phase, at least
PHASE_S = 0.75  # timed seconds per phase, at least (whichever of the two is longer)
PROBE_TARGET_S = 0.05  # a probe matmul is grown until one takes this long, so the clock can resolve it
PROBE_S = 0.3  # then timed for about this long, the best repeat kept
PROBE_MAX_N = {"cpu": 2048, "cuda": 16384}  # the largest square the probe tries, per device type

CEILING_ENV = "AUTOTUNE_CEILING"  # "0": not measured (one more process at every search's end)


def why_not(cfg: TrialConfig) -> str | None:
    """Why `cfg` has no ceiling to measure, or None."""
    if os.environ.get(CEILING_ENV, "1") == "0":
        return f"turned off ({CEILING_ENV}=0)"
    return kind_of(cfg.pipeline).why_no_ceiling


@dataclass(frozen=True)
class Timed:
    """One phase of timed steps."""

    samples_per_s: float
    data_wait: float  # share of the phase's wall time spent waiting for the next batch
    steps: int
    seconds: float


def samples_per_step(cfg: TrialConfig) -> int:
    """What one h.step consumes: grad_accum micro-batches of batch_size samples."""
    return cfg.batch_size * cfg.grad_accum


def warm_up(h: Any, source: Iterator[Any], steps: int) -> None:
    """Untimed steps outside any phase: one-off costs (allocations, kernel selection) before the first.
    A phase's own warm-up is its clock's (timed_steps' `warmup`)."""
    for _ in range(steps):
        h.step(next(source))


def timed_steps(h: Any, source: Iterator[Any], min_steps: int, seconds: float, warmup: int = 0) -> Timed:
    """One phase on a Clock of its own: `warmup` untimed steps, then h.step on `source` until both
    `min_steps` and `seconds` are reached. The clock syncs before every read and before each fetch, and
    counts the time blocked on `source` inside each step, so the phase's time is the steps' own."""
    from autotune.trial.measurement.clock import Clock, Span

    # No meters: the rounds meter other processes' CPU use as a whole (a phase is shorter than it can be
    # judged over), and the section holds no peak memory or NVML utilisation of the phase's steps.
    clock = Clock(Span(warmup, min_steps, seconds, meters=False), h.device)
    clock.begin()
    while True:
        clock.fetching()
        batch = next(source)
        clock.fetched()
        h.step(batch)
        if clock.step_end():
            break
    elapsed, steps = clock.seconds, clock.timed_steps
    assert elapsed is not None  # the window closed on its steps and seconds
    return Timed(steps * samples_per_step(h.cfg) / elapsed, clock.waited_s / elapsed, steps, elapsed)


def step_flops(h: Any, batch: Any) -> tuple[int, str | None]:
    """FLOPs of one training step on `batch`, counted by FlopCounterMode; (0, why) when none can be."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter:
            h.step(batch)
    except Exception as e:  # noqa: BLE001 - a step the counter cannot follow is a reason, not a failure
        return 0, f"FlopCounterMode could not follow the step: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    total = int(counter.get_total_flops())
    if total > 0:
        return total, None
    why = "FlopCounterMode counted no FLOPs in the step: the model has no op it counts (matmul, conv, attention)"
    if h.cfg.compile != "off":
        why += f", or compile={h.cfg.compile} hid them in a compiled graph"
    return 0, why


def compute_dtype(h: Any) -> Any:
    """The dtype the step's matmuls and convolutions run in: autocast's, else the parameters'."""
    return h.precision.dtype if h.precision.enabled else next(h.model.parameters()).dtype


def peak_probe(device: Any, dtype: Any) -> dict[str, Any]:
    """This device's matmul rate at `dtype`: a square n x n product, n doubled from 256 until one takes
    PROBE_TARGET_S (or PROBE_MAX_N), then repeated for about PROBE_S; the best repeat's 2n^3 / seconds."""
    import torch

    from autotune.trial.measurement import measure

    def once(a: torch.Tensor, b: torch.Tensor) -> float:
        t0 = measure.now(device)
        torch.mm(a, b)
        return measure.now(device) - t0

    n, cap = 256, PROBE_MAX_N.get(device.type, PROBE_MAX_N["cpu"])
    while True:
        try:
            a2 = torch.randn(n, n, device=device).to(dtype)
            b2 = torch.randn(n, n, device=device).to(dtype)
        except torch.OutOfMemoryError:  # a device the model nearly fills: the last size that fitted
            if n == 256:
                raise
            n //= 2
            break
        a, b = a2, b2
        once(a, b)  # the first product at a size pays for workspace and kernel choice
        took = once(a, b)
        if took >= PROBE_TARGET_S or n >= cap:
            break
        n *= 2
    best, reps, spent = took, 1, took
    while spent < PROBE_S:
        t = once(a, b)
        best, reps, spent = min(best, t), reps + 1, spent + t
    return {
        "flops_per_s": 2 * n**3 / best,
        "method": f"best of {reps} {n}x{n} {str(dtype).removeprefix('torch.')} torch.mm on {device.type}, "
        f"{torch.get_num_threads()} thread(s)",
        "size": n,
        "repeats": reps,
    }


def measure_ceiling(cfg: TrialConfig) -> dict[str, Any]:
    """The ceiling section of `cfg`, measured in this process (see the module docstring)."""
    from autotune.trial.loop.harness import build

    t_start = time.monotonic()
    h = build(cfg, endless=True)
    stream = h.batches()
    cached = [next(stream) for _ in range(CACHED_BATCHES)]  # materialised once, as the loader made them
    prefetched = max(1, cfg.batches_ahead)
    e2e, comp, others_cpu = alternated_rounds(h, stream, cached, prefetched)
    end_to_end = statistics.median(t.samples_per_s for t in e2e)
    compute_only = statistics.median(t.samples_per_s for t in comp)
    section: dict[str, Any] = {
        "end_to_end_samples_per_s": end_to_end,
        "compute_only_samples_per_s": compute_only,
        "data_bound_ratio": end_to_end / compute_only,
        "lost_to_data_wait": max(0.0, 1.0 - end_to_end / compute_only),
        "data_wait_fraction": statistics.median(t.data_wait for t in e2e),
        "ceiling_method": (
            f"one process (harness.build, as a trial), {ROUNDS} rounds alternating which goes first, medians: "
            f"{'+'.join(str(t.steps) for t in e2e)} steps from the loader "
            f"({sum(t.seconds for t in e2e):.1f} s), {'+'.join(str(t.steps) for t in comp)} steps on "
            f"{CACHED_BATCHES} cached batches ({sum(t.seconds for t in comp):.1f} s, no loader), after 1 "
            f"untimed step, and {prefetched} untimed loader step(s) before each loader phase; "
            f"batch {cfg.batch_size} x {cfg.grad_accum} micro-batch(es), {cfg.image_size} px, "
            f"{cfg.precision}, device {h.device.type}"
        ),
        "others_cpu": others_cpu,
        **utilisation(cfg, h, cached[0], end_to_end, compute_only),
    }
    section["seconds"] = time.monotonic() - t_start
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in section.items()}


def alternated_rounds(
    h: Any, stream: Iterator[Any], cached: list[Any], prefetched: int
) -> tuple[list[Timed], list[Timed], float | None]:
    """ROUNDS of a loader-fed phase and a cached-batch phase, alternating which goes first (as
    benchmarks/roofline.py does): their timings, and the CPUs other processes kept busy meanwhile."""
    from autotune.trial.measurement.contention import OtherCpu

    cycle: Iterator[Any] = itertools.cycle(cached)
    e2e: list[Timed] = []
    comp: list[Timed] = []
    with OtherCpu() as others:
        warm_up(h, cycle, 1)  # one-off costs: allocations, kernel choice
        for r in range(ROUNDS):
            for loader_fed in (True, False) if r % 2 == 0 else (False, True):
                if loader_fed:
                    # The clock's warm-up steps through the batches, not just drains them: what the workers
                    # prefetched while the loader was not read costs no wait, and a queue emptied at once
                    # makes the first steps wait more than in a trial's steady state.
                    e2e.append(timed_steps(h, stream, MIN_STEPS, PHASE_S, warmup=prefetched))
                else:
                    comp.append(timed_steps(h, cycle, MIN_STEPS, PHASE_S))
    return e2e, comp, others.cpus


def utilisation(cfg: TrialConfig, h: Any, batch: Any, end_to_end: float, compute_only: float) -> dict[str, Any]:
    """Model FLOPs utilisation at both rates: one step's FLOPs per sample over the probed peak at the
    step's dtype; or why the FLOPs could not be counted."""
    flops, no_flops = step_flops(h, batch)
    if no_flops:
        return {"utilisation": None, "utilisation_not_counted": no_flops}
    dtype = compute_dtype(h)
    peak = peak_probe(h.device, dtype)
    per_sample = flops / samples_per_step(cfg)
    return {
        "flops_per_sample": per_sample,
        "flops_method": f"FlopCounterMode over one training step (forward, backward, optimizer) of "
        f"{samples_per_step(cfg)} samples",
        "peak_flops_per_s": peak["flops_per_s"],
        "peak_method": peak["method"],
        "peak_dtype": str(dtype).removeprefix("torch."),
        "probe_size": peak["size"],
        "utilisation": per_sample * end_to_end / peak["flops_per_s"],
        "utilisation_compute_only": per_sample * compute_only / peak["flops_per_s"],
    }


def run_ceiling(cfg: TrialConfig, folder: Path, timeout_s: float) -> dict[str, Any]:
    """Measure `cfg`'s ceiling in a fresh process; its section, or {"skipped": why} when it failed."""
    from autotune.core.errors import TrialTimeout
    from autotune.trial.processes.launcher import (
        EntryFailed,
        run_entry,
    )  # not at import: the measuring process needs none

    started = time.monotonic()
    try:
        section = run_entry("autotune.trial.probes.ceiling", cfg, folder, "ceiling.json", timeout_s)
    except TrialTimeout:
        return {"skipped": f"no result within the {timeout_s:.0f} s the budget left it (log: {folder / 'ceiling.log'})"}
    except EntryFailed as e:
        return {"skipped": f"the measurement failed ({e})"}
    return {**section, "wall_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.trial.probes.ceiling",
        description="Measure a config's compute-only ceiling and model FLOPs utilisation.",
    )
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    die_with_parent()
    from autotune.core.configfile import load_config
    from autotune.trial.loop.outcome import entry_main

    return entry_main("ceiling", lambda: measure_ceiling(load_config(args.config)), args.out)


if __name__ == "__main__":
    sys.exit(main())
