"""The same trial measured by two checkouts of autotune, alternated in paired rounds: does a change to the
code leave what a trial measures where it was?

Each round runs `python -m autotune trial --config CONFIG` once per tree, each a fresh process with
PYTHONPATH pointing at that tree (so one venv serves both), the order reversed every other round so
drift hits both alike. It prints each trial's samples/s with the 1-minute load, then the per-round
ratio (second tree over first), its median and range. Run it on an idle machine: another busy process
makes a trial on 2 cores 10-20x slower.

    .venv/bin/python benchmarks/two_trees.py BEFORE_TREE AFTER_TREE --config trial.yaml [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def measure(tree: Path, config: Path, out: Path, seconds: float | None, timeout: float) -> float:
    """One trial of `config` run by the autotune in `tree`; its samples/s."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "autotune", "trial", "--config", str(config), "--out", str(out)]
    if seconds is not None:
        cmd += ["--seconds", str(seconds)]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: trial exited {done.returncode}:\n{done.stderr[-2000:]}")
    return float(json.loads(out.read_text())["samples_per_s"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("first", type=Path, help="checkout measured first in even rounds (e.g. before a change)")
    p.add_argument("second", type=Path, help="the other checkout (e.g. after it)")
    p.add_argument("--config", type=Path, required=True, help="a TrialConfig YAML, as `autotune trial` takes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=None, help="measure each trial this long (default: its steps)")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    trees = [args.first.resolve(), args.second.resolve()]
    config = args.config.resolve()
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="two-trees-") as tmp:
        for r in range(args.rounds):
            got: dict[int, float] = {}
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                got[i] = measure(trees[i], config, Path(tmp) / f"r{r}-{i}.json", args.seconds, args.timeout)
                load = os.getloadavg()[0]
                print(f"round {r} {trees[i]}  {got[i]:8.3f} samples/s  load {load:.2f} on {os.cpu_count()} CPUs")
            ratios.append(got[1] / got[0])
            print(f"round {r} ratio second/first x{ratios[-1]:.3f}", flush=True)
    print(
        f"median ratio x{statistics.median(ratios):.3f} (x{min(ratios):.3f}..x{max(ratios):.3f}) "
        f"over {len(ratios)} paired round(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
