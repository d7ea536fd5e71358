"""Does the time-to-target verdict predict real training? The search's check against `autotune train`.

For configs that change the optimizer step (a larger global batch, so a scaled lr), in one run:

  trial    samples/s of the baseline and each config, from `autotune.trial.processes.launcher.run_trial` (the
           isolated measured trial a search runs), in interleaved rounds; medians
  verdict  `autotune.search.checks.target.check`: the config trains from the baseline's initial weights and data
           order for up to CAP x the baseline's reference samples; speedup to target = the baseline's
           time to its own smoothed loss after K steps / the config's (the search's class check)
  train    `python -m autotune.apply.train` (as `autotune train` runs it, a fresh process each) for
           --epochs epochs, the baseline once and each config once; the wall time until the end of the
           first epoch whose validation IoU reaches the baseline's final IoU (validation not timed)

and prints one row per config: the verdict (pass/fail, to-target x) next to train's time-to-IoU ratio,
and whether they agree (the verdict passes exactly when training reaches the baseline's IoU sooner).

    .venv/bin/python benchmarks/to_target.py --data DIR --image-size 96 --epochs 5

Exit code: 0 all agree, 3 some disagree, 1 a run failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from autotune.apply.comparison import time_to  # noqa: E402
from autotune.apply.train import run_config  # noqa: E402
from autotune.core.config import TrialConfig, baseline_of  # noqa: E402
from autotune.pipelines import base_config  # noqa: E402
from autotune.search.checks import parity, target  # noqa: E402
from autotune.trial.processes import launcher  # noqa: E402

# name -> knobs over the baseline (plain PyTorch, batch 8). Each changes the optimizer step.
CONFIGS: dict[str, dict[str, Any]] = {
    "b16-sqrt": {"batch_size": 16},
    "b32-sqrt": {"batch_size": 32},
    "b64-sqrt": {"batch_size": 64},
    "b32-linear": {"batch_size": 32, "lr_scaling": "linear"},
}


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"


def throughput(cfgs: dict[str, TrialConfig], rounds: int, out: Path, timeout: float) -> dict[str, float]:
    """Median samples/s per config over interleaved rounds (odd rounds reversed, so drift hits all)."""
    seen: dict[str, list[float]] = {n: [] for n in cfgs}
    for r in range(rounds):
        order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
        for name in order:
            res = launcher.run_trial(cfgs[name], out / f"trial-r{r}-{name}", timeout)
            seen[name].append(res.samples_per_s)
            print(f"round {r} {name:11s} {res.samples_per_s:7.2f} samples/s  {load()}", flush=True)
    return {n: statistics.median(v) for n, v in seen.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--image-size", type=int, default=96)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--parity-steps", type=int, default=30, help="K: the reference steps (the search's default)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per throughput trial")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", help="comma-separated config names")
    p.add_argument("--out-dir")
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args(argv)
    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    out = Path(a.out_dir or tempfile.mkdtemp(prefix="to-target-"))
    base = base_config("unet", a.image_size, a.data, str(out / "studies"), seconds=a.seconds, warmup_steps=3, window=3)
    names = a.only.split(",") if a.only else list(CONFIGS)
    cfgs = {"baseline": baseline_of(base), **{n: base.replace(**CONFIGS[n]) for n in names}}
    print(f"data {base.data_dir}, {a.image_size} px, out {out}, {load()}", flush=True)

    sps = throughput(cfgs, a.rounds, out, a.timeout)
    ref = parity.noise_reference(cfgs["baseline"], a.parity_steps, out / "reference", a.timeout)
    print(f"reference: {a.parity_steps} steps x 2 runs in {ref.seconds:.0f} s, {load()}", flush=True)
    verdicts = {n: target.check(cfgs[n], ref, out / f"check-{n}", a.timeout, sps[n], sps["baseline"]) for n in names}
    for n, v in verdicts.items():
        print(f"verdict {n:11s} {'pass' if v.passed else 'FAIL'}: {v.reason} ({v.seconds:.0f} s, {load()})", flush=True)

    say = lambda line: print(line, flush=True)  # noqa: E731
    runs = {n: run_config(c, a.epochs, out / "train", n, say) for n, c in cfgs.items()}
    goal = runs["baseline"]["iou"]
    base_t = time_to(runs["baseline"]["history"], "iou", goal)
    print(
        f"\nbaseline: final IoU {goal:.4f} after {a.epochs} epochs, reached at {base_t[0]:.1f} s "
        f"(epoch {base_t[1]}); trial {sps['baseline']:.2f} samples/s  {load()}\n"
    )
    print(
        f"{'config':11s} {'g.batch':>7s} {'lr':>8s} {'samples/s x':>11s} {'verdict':>7s} {'to target x':>11s} "
        f"{'train s to IoU':>14s} {'train x':>7s} {'final IoU':>9s}  agree"
    )
    disagree = 0
    for n in names:
        v, r = verdicts[n], runs[n]
        t = time_to(r["history"], "iou", goal)
        real = base_t[0] / t[0] if t else None
        agree = v.passed == (real is not None and real > 1)
        disagree += not agree
        print(
            f"{n:11s} {cfgs[n].global_batch_size:7d} {cfgs[n].effective_lr:8.2g} {sps[n] / sps['baseline']:11.2f} "
            f"{'pass' if v.passed else 'fail':>7s} {'-' if v.speedup is None else f'{v.speedup:.2f}':>11s} "
            f"{'not reached' if t is None else f'{t[0]:.1f}':>14s} {'-' if real is None else f'{real:.2f}':>7s} "
            f"{r['iou']:9.4f}  {'yes' if agree else 'NO'}"
        )
    return 3 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
