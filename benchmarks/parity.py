"""What the parity check's tolerance rests on: how far each kind of change moves a short loss trajectory,
next to natural training noise, on the real Unet (and the broken-numerics test pipeline).

Every figure comes from autotune.search.checks.parity itself: one noise reference per workload (the baseline
and its data-order twin, data_seed + 1, same initial weights), then check() for each candidate, each
run a fresh trial process forked from a warm server, as in a search. Printed per candidate:

  deviation  parity's figure: mean |smoothed candidate - smoothed baseline| / mean |smoothed baseline|
  per-step   the unsmoothed mean of |candidate - baseline| / |baseline| step by step (equal batches only)
  noise      the data-order twin's deviation over the same window
  ratio      deviation / noise: what FRACTION is compared with

    PYTHONPATH=. python benchmarks/parity.py [--batch 8] [--steps 30] [--image-size 64] [--also-batch 4]
                                              [--threads 1] [--data DIR] [--out-dir DIR] [--skip-large] [--timeout S]

Without --data: 64 synthetic 160x120 pairs (make_data, seed 0) under the output folder. The global
batch 8 -> 64 row extends the reference to 8 x K baseline steps (2 more runs, each the candidate's
samples): the slowest part, skipped by --skip-large.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def per_step(candidate: list[float], baseline: list[float]) -> float:
    return sum(abs(c - b) / abs(b) for c, b in zip(candidate, baseline)) / len(baseline)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--also-batch", type=int, default=None, help="a second, smaller Unet block: reference, bf16")
    ap.add_argument("--data", default=None)
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--skip-large", action="store_true", help="leave out the global batch x8 row")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per run")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads of every run (1: on a shared 2-core machine two contending threads run "
        "a step several times slower); the other count is one of the candidates",
    )
    args = ap.parse_args()
    print("$ " + shlex.join([sys.executable, *sys.argv]))
    print(f"load average {load()}", flush=True)

    from autotune.core.config import TrialConfig
    from autotune.pipelines import preload_modules
    from autotune.pipelines.unet.data import make_data
    from autotune.search.checks import parity
    from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer

    out = Path(args.out_dir or tempfile.mkdtemp(prefix="parity-bench-"))
    data = Path(args.data) if args.data else out / "data"
    if not args.data and not data.exists():
        make_data(data, 64, (160, 120), 0)
    k, b = args.steps, args.batch
    unet = TrialConfig(image_size=args.image_size, batch_size=b, data_dir=str(data.resolve()), num_threads=args.threads)
    rule = TrialConfig(pipeline="tests.parity_pipelines:offset", image_size=64, batch_size=b, num_threads=args.threads)
    other_threads = 2 if args.threads == 1 else 1
    print(
        f"data {data}, {args.image_size} px, batch {b}, {k} steps, {args.threads} thread(s); trial folders under {out}; "
        f"FRACTION {parity.FRACTION}, FLOOR {parity.FLOOR}, SMOOTH {parity.SMOOTH}\n",
        flush=True,
    )

    rows: list[dict[str, Any]] = []
    t_all = time.monotonic()
    with WarmServer.start((*DEFAULT_PRELOAD, *preload_modules("unet"), "tests.parity_pipelines")) as server:

        def block(name: str, base: TrialConfig, steps: int, candidates: list[tuple[str, TrialConfig]]) -> Any:
            folder = out / name
            t0 = time.monotonic()
            ref = parity.noise_reference(base, steps, folder / "reference", args.timeout, server)
            twin_step = per_step(list(ref.twin_losses), list(ref.losses))
            print(
                f"[{name}] reference (baseline + twin, 2 runs of {steps} steps): {time.monotonic() - t0:.0f} s, "
                f"noise {ref.noise:.2%}, twin per-step {twin_step:.2%}, load {load()}",
                flush=True,
            )
            rows.append(
                {
                    "block": name,
                    "label": "data-order twin (the noise)",
                    "deviation": ref.noise,
                    "noise": ref.noise,
                    "per_step": twin_step,
                    "seconds": ref.seconds,
                    "runs": 2,
                    "verdict": "-",
                }
            )
            (folder / "reference.json").write_text(json.dumps(ref.to_dict()))
            for label, cand in candidates:
                candidate(name, label, cand, base, steps, ref)
            return ref

        def candidate(name: str, label: str, cand: TrialConfig, base: TrialConfig, steps: int, ref: Any) -> None:
            where = out / name / label.split()[0]
            v = parity.check(cand, base, steps, where, args.timeout, server, reference=ref)
            losses = (
                json.loads((where / "candidate" / "result.json").read_text())["losses"] if v.failure is None else []
            )
            step_dev = (
                per_step(losses, list(ref.losses)) if v.candidate_steps == v.baseline_steps == len(losses) else None
            )
            rows.append(
                {
                    "block": name,
                    "label": label,
                    "deviation": v.deviation,
                    "noise": v.noise,
                    "per_step": step_dev,
                    "seconds": v.seconds,
                    "runs": v.runs,
                    "verdict": v.to_dict()["verdict"],
                    "reason": v.reason,
                }
            )
            print(
                f"[{name}] {label:<36} {v.to_dict()['verdict']}  {v.reason}  ({v.seconds:.0f} s, {v.runs} run(s), "
                f"load {load()})",
                flush=True,
            )

        half = max(1, b // 2)
        ref = block(
            f"unet-b{b}",
            unet,
            k,
            [
                ("fp32-same-seed (the baseline again)", unet),
                ("bf16", unet.replace(precision="bf16")),
                ("channels_last", unet.replace(channels_last=True)),
                (f"num_threads={other_threads}", unet.replace(num_threads=other_threads)),
                (f"micro-batch {half}x2 at global {b}", unet.replace(batch_size=half, global_batch=b)),
                ("num_workers=2", unet.replace(num_workers=2)),
                ("twin-2 (data_seed + 2: the noise's spread)", unet.replace(data_seed=unet.seed + 2)),
                ("seed-1 (other initial weights)", unet.replace(seed=1)),
            ],
        )
        block(
            "offset-pipeline",
            rule,
            k,
            [("bf16 (broken numerics)", rule.replace(precision="bf16")), ("fp32-same-seed (the baseline again)", rule)],
        )
        if args.also_batch:
            ub = unet.replace(batch_size=args.also_batch)
            block(f"unet-b{args.also_batch}", ub, k, [("bf16", ub.replace(precision="bf16"))])
        if not args.skip_large:  # its reference is extended to 8 x k baseline steps: 2 more runs
            candidate(
                f"unet-b{b}",
                f"global-batch {b}->{8 * b} (sqrt lr, equal samples)",
                unet.replace(batch_size=8 * b),
                unet,
                k,
                ref,
            )

    print(
        f"\nratio table: deviation / data-order noise (tolerance: ratio <= {parity.FRACTION}, or deviation "
        f"<= {parity.FLOOR:.1%}); {time.monotonic() - t_all:.0f} s in all, load {load()}"
    )
    print(
        f"  {'block':<16} {'candidate':<36} {'deviation':>9} {'per-step':>9} {'noise':>7} {'ratio':>7}  verdict  seconds"
    )
    for r in rows:
        dev = "-" if r["deviation"] is None else f"{r['deviation']:.2%}"
        ps = "-" if r["per_step"] is None else f"{r['per_step']:.2%}"
        ratio = "-" if r["deviation"] is None or not r["noise"] else f"{r['deviation'] / r['noise']:.3f}"
        print(
            f"  {r['block']:<16} {r['label']:<36} {dev:>9} {ps:>9} {(r['noise'] or 0):>7.2%} {ratio:>7}  "
            f"{r['verdict']:<7}  {r['seconds']:>6.0f}"
        )
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
