"""Measure two knob ratios side by side, in one run, on the real Unet pipeline.

    bf16 / fp32            precision, at batch 8 and num_workers 0
    workers2 / workers0    num_workers, at fp32 and batch 8

Every trial is a real isolated trial process started by `autotune.trial.processes.launcher.run_trial`, the same
path a search takes. The three distinct configs (fp32-w0 is the shared denominator of both ratios)
are run in rounds, interleaved, so machine noise and drift hit all of them alike; odd rounds run in
reverse order so that no config always goes first after a cold start. Per round, each ratio is
taken within the round; the summary gives the median samples/s per config, the ratio of medians
and the median of the per-round ratios.

    .venv/bin/python benchmarks/knob_ratios.py --repeats 3 --seconds 15
    .venv/bin/python benchmarks/knob_ratios.py --config studies/autotune/best.yaml   # best vs baseline

With --config, the two configs are the exported one and the plain-PyTorch baseline on the same
workload (its pipeline, data and image size), and the ratio is best/baseline: a search's speedup
re-measured side by side.

Exit code: 0 when every trial finished, 1 when any trial failed (the others are still reported).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from autotune.core import errors  # noqa: E402
from autotune.trial.processes import launcher  # noqa: E402
from autotune.core.config import BASELINE, TrialConfig  # noqa: E402
from autotune.core.configfile import load_config  # noqa: E402
from autotune.pipelines.unet.data import default_data  # noqa: E402

# name -> the knobs that differ from TrialConfig's defaults (fp32, batch 8, num_workers 0)
CONFIGS: dict[str, dict[str, object]] = {
    "fp32-w0": {"precision": "fp32", "batch_size": 8, "num_workers": 0},
    "bf16-w0": {"precision": "bf16", "batch_size": 8, "num_workers": 0},
    "fp32-w2": {"precision": "fp32", "batch_size": 8, "num_workers": 2},
}
# ratio name -> (numerator config, denominator config)
RATIOS = {"bf16/fp32": ("bf16-w0", "fp32-w0"), "workers2/workers0": ("fp32-w2", "fp32-w0")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image-size", type=int, default=128, help="training crop size in px (default 128)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all configs (default 3)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per trial, after warm-up (default 20)")
    p.add_argument(
        "--warmup-steps", type=int, default=3, help="untimed steps per trial (default 3, as `autotune search`)"
    )
    p.add_argument(
        "--data",
        metavar="DIR",
        help="dataset folder with images/ and masks/ "
        "(default: the synthetic set under studies/data, generated on first use)",
    )
    p.add_argument("--out-dir", metavar="DIR", help="where trial folders go (default: a fresh temp folder)")
    p.add_argument(
        "--config", metavar="FILE", help="compare this config (e.g. an exported best.yaml) with the baseline"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds before a trial is killed (default seconds + 300)"
    )
    args = p.parse_args(argv)
    if args.repeats < 1 or args.seconds <= 0:
        p.error("--repeats must be >= 1 and --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shown = [sys.executable, *sys.argv] if argv is None else [sys.executable, __file__, *argv]
    print("$ " + shlex.join(shown), flush=True)

    data = Path(args.data).resolve() if args.data else default_data(ROOT / "studies")
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="knob-ratios-"))
    timeout = args.timeout or args.seconds + 300
    base = TrialConfig(
        data_dir=str(data), image_size=args.image_size, seconds=args.seconds, warmup_steps=args.warmup_steps, window=3
    )
    configs, ratios = CONFIGS, RATIOS
    if args.config:
        best = load_config(args.config)
        base = best.replace(**BASELINE.knobs(), seconds=args.seconds, warmup_steps=args.warmup_steps)
        configs = {"baseline": BASELINE.knobs(), "best": best.knobs()}
        ratios = {"best/baseline": ("best", "baseline")}
    print(
        f"data {base.data_dir}, image {base.image_size} px, {args.repeats} round(s) x {len(configs)} configs, "
        f"{args.seconds:g} s measured per trial, trial folders under {out_dir}",
        flush=True,
    )

    names = list(configs)
    sps: dict[str, list[float | None]] = {n: [] for n in names}
    failures = 0
    t_all = time.monotonic()
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            cfg = base.replace(**configs[name])  # type: ignore[arg-type]
            t0 = time.monotonic()
            try:
                res = launcher.run_trial(cfg, out_dir / f"r{r}-{name}", timeout)
            except errors.TrialFailure as e:
                failures += 1
                sps[name].append(None)
                print(f"round {r} {name:8s} FAILED ({e.reason}): {e}", flush=True)
                if e.log_tail:
                    print("  " + e.log_tail.replace("\n", "\n  "), flush=True)
                continue
            sps[name].append(res.samples_per_s)
            # The 1-minute load average shows how much else was running: this is a shared machine.
            print(
                f"round {r} {name:8s} {res.samples_per_s:7.2f} samples/s  step p50 {res.step_time_p50 * 1e3:5.0f} ms  "
                f"p90 {res.step_time_p90 * 1e3:5.0f} ms  data wait {res.data_wait_fraction:4.0%}  "
                f"{res.timed_steps:3d} steps  whole trial {time.monotonic() - t0:3.0f} s  "
                f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
                flush=True,
            )

    print(f"\nper config (samples/s; {args.repeats} round(s), {time.monotonic() - t_all:.0f} s in all)")
    medians: dict[str, float | None] = {}
    for name in names:
        ok = [v for v in sps[name] if v is not None]
        medians[name] = statistics.median(ok) if ok else None
        per = "  ".join("failed" if v is None else f"{v:.2f}" for v in sps[name])
        med = f"{medians[name]:.2f}" if medians[name] is not None else "-"
        print(f"  {name:8s} median {med:>7s}   per round: {per}")

    print("\nratios")
    for ratio, (num, den) in ratios.items():
        per_round = [a / b for a, b in zip(sps[num], sps[den]) if a is not None and b]
        mn, md = medians[num], medians[den]
        of_medians = f"{mn / md:.2f}x" if mn is not None and md else "-"
        med_of_rounds = f"{statistics.median(per_round):.2f}x" if per_round else "-"
        rounds = "  ".join(f"{x:.2f}" for x in per_round) or "-"
        print(
            f"  {ratio:18s} ratio of medians {of_medians:>6s}   median of per-round ratios {med_of_rounds:>6s}   "
            f"per round: {rounds}"
        )
    if failures:
        print(f"\n{failures} trial(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
