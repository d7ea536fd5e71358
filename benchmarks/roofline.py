"""Is the input pipeline hidden? End-to-end samples/s divided by the same config fed pre-loaded tensors.

One process, one model: `autotune.trial.loop.harness.build(cfg)` applies every knob exactly as a trial does. Then,
in rounds, alternating which goes first:

  end-to-end   h.step on batches from the config's DataLoader (decode, crop, workers: all of it)
  compute      h.step on a few batches taken from that loader once and cycled (same shapes, same
               knobs, same to_device copy inside the step), so only the loader's cost is missing

The steps are timed by autotune.trial.probes.ceiling's `warm_up` and `timed_steps`, the code with which `search`
measures best.yaml's `ceiling:` section. Each phase starts with untimed steps: at least 2, and enough to drain the batches that loader workers
prefetched while the other phase ran (num_workers x prefetch_factor). h.step ends in loss.item(), a
device sync, and the clock is read after a sync. The ratio end-to-end / compute is printed per round,
as a ratio of medians and as the median of per-round ratios: >= 0.9 means the input pipeline is hidden.
Other processes' CPU use is metered per phase; the verdict uses the median ratio of the rounds in which
both phases had the machine to themselves (<= --contended-above CPUs elsewhere), and the ratio of
medians only when there was no such round.

    .venv/bin/python benchmarks/roofline.py                      # the warm start config on this machine
    .venv/bin/python benchmarks/roofline.py --config best.yaml   # an exported best config

Exit code: 0 ratio >= 0.9, 3 ratio below it, 1 the pipeline failed to build or step.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks (shared load meter)

from repeatability import OtherLoad, load_config, shown_command, wait_for_quiet  # noqa: E402

GOAL = 0.9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="take the knobs from this config (e.g. an exported best.yaml); "
        "default: autotune.search.loop.study.warm_start for this machine",
    )
    p.add_argument("--image-size", type=int, default=128, help="training crop size in px (default 128)")
    p.add_argument("--rounds", type=int, default=6, help="rounds of (end-to-end, compute) (default 6)")
    p.add_argument("--seconds", type=float, default=8.0, help="timed seconds per phase (default 8)")
    p.add_argument(
        "--quiet-below",
        type=float,
        default=None,
        metavar="CPUS",
        help="before each round, wait until other processes use fewer CPUs than this (default: don't wait)",
    )
    p.add_argument("--quiet-wait", type=float, default=60.0, metavar="S", help="longest wait for quiet (default 60)")
    p.add_argument(
        "--contended-above",
        type=float,
        default=0.3,
        metavar="CPUS",
        help="a round in which other processes used more than this is reported apart (default 0.3)",
    )
    p.add_argument("--min-steps", type=int, default=5, help="at least this many timed steps per phase (default 5)")
    p.add_argument(
        "--cached-batches", type=int, default=4, help="batches materialised once for the compute phase (default 4)"
    )
    p.add_argument("--data", metavar="DIR", help="dataset folder (default: the CLI's synthetic set under studies/data)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.cached_batches < 1:
        p.error("--rounds and --cached-batches must be >= 1 and --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(shown_command(argv, __file__), flush=True)

    from autotune.trial.probes import ceiling  # the measuring steps `search` runs for best.yaml's ceiling
    from autotune.core.config import TrialConfig
    from autotune.pipelines.unet.data import default_data
    from autotune.trial.loop.harness import build
    from autotune.search.space.machine import Hardware
    from autotune.search.loop.study import warm_start

    data = Path(args.data).resolve() if args.data else default_data(ROOT / "studies")
    base = TrialConfig(data_dir=str(data), image_size=args.image_size)
    cfg = load_config(args.config, base) if args.config else warm_start(base, Hardware.detect())
    if cfg.gpus > 1:
        print("roofline measures one process; a gpus > 1 config is measured with gpus=1", flush=True)
        cfg = cfg.replace(gpus=1)
    print(
        "config: "
        + " ".join(f"{k}={v}" for k, v in cfg.knobs().items())
        + f" ({'from ' + args.config if args.config else 'autotune.study.warm_start on this machine'})",
        flush=True,
    )
    print(
        f"workload: {cfg.image_size} px, data {cfg.data_dir}; {args.rounds} round(s), {args.seconds:g} s per phase, "
        f"{args.cached_batches} cached batches",
        flush=True,
    )

    t_build = time.monotonic()
    try:
        h = build(cfg)
    except Exception as e:  # noqa: BLE001 - a benchmark reports and exits 1
        print(f"could not build the pipeline: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    device = h.device
    stream = h.batches()
    cached = [next(stream) for _ in range(args.cached_batches)]  # materialised once, as the loader made them
    cycle: Iterator[Any] = itertools.cycle(cached)
    prefetched = cfg.num_workers * (cfg.prefetch_factor or 2) if cfg.num_workers else 0
    warm = max(2, prefetched)
    print(
        f"built in {time.monotonic() - t_build:.1f} s; {warm} untimed steps per phase "
        f"({prefetched} batches can be prefetched by the workers)\n",
        flush=True,
    )

    def phase(source: Iterator[Any]) -> tuple[float, float, int, float]:
        ceiling.warm_up(h, source, warm)
        with OtherLoad() as other:
            t = ceiling.timed_steps(h, source, args.min_steps, args.seconds)
        return t.samples_per_s, t.data_wait, t.steps, other.cpus

    e2e: list[float] = []
    comp: list[float] = []
    calm: list[bool] = []  # both phases of the round ran with little else on the machine
    try:
        for r in range(args.rounds):
            quiet = wait_for_quiet(args.quiet_below, args.quiet_wait)
            if quiet:
                print(f"  ({quiet})", flush=True)
            worst = 0.0
            order = ("end-to-end", "compute") if r % 2 == 0 else ("compute", "end-to-end")
            got: dict[str, float] = {}
            for name in order:
                sps, wait, steps, others = phase(stream if name == "end-to-end" else cycle)
                got[name] = sps
                worst = max(worst, others)
                print(
                    f"round {r} {name:10s} {sps:7.2f} samples/s  {steps:3d} steps  data wait {wait:4.0%}  "
                    f"load {os.getloadavg()[0]:.1f}  others {others:.2f} CPUs",
                    flush=True,
                )
            e2e.append(got["end-to-end"])
            comp.append(got["compute"])
            calm.append(worst <= args.contended_above)
            print(f"round {r} ratio      {got['end-to-end'] / got['compute']:.2f}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"a step failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    per_round = [a / b for a, b in zip(e2e, comp)]
    ratio = statistics.median(e2e) / statistics.median(comp)
    print(
        f"\nend-to-end median {statistics.median(e2e):.2f} samples/s, compute only median {statistics.median(comp):.2f}; "
        f"ratio of medians {ratio:.2f}, median of per-round ratios {statistics.median(per_round):.2f} "
        f"(per round: {'  '.join(f'{x:.2f}' for x in per_round)})"
    )
    calm_ratios = [x for x, c in zip(per_round, calm) if c]
    if calm_ratios:
        print(
            f"rounds with other processes <= {args.contended_above:g} CPUs in both phases: {len(calm_ratios)}, "
            f"median ratio {statistics.median(calm_ratios):.2f}"
        )
        ratio = statistics.median(calm_ratios)
    else:
        print(
            f"no round ran with other processes <= {args.contended_above:g} CPUs in both phases: "
            "the figure below is the contended ratio of medians"
        )
    verdict = (
        "input pipeline hidden"
        if ratio >= GOAL
        else f"input pipeline NOT hidden: {1 - ratio:.0%} of compute-only throughput is lost to loading"
    )
    print(f"goal >= {GOAL}: {verdict}")
    if ratio < GOAL and device.type == "cpu" and cfg.num_workers > 0:
        print(
            f"  on CPU the loader workers' decoding runs on the same {os.cpu_count()} cores as the model's "
            f"{h.applied.get('num_threads', {}).get('in_effect', '?')} intra-op threads, so it cannot be fully hidden; "
            "it can only be made cheaper (smaller source images, a cheaper decode) or given its own cores"
        )
    return 0 if ratio >= GOAL else 3


if __name__ == "__main__":
    sys.exit(main())
