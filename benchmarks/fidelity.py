"""Does a short trial rank configs the way real training does? Short trial vs 3-epoch `autotune train`.

For each of 10 diverse configs (precision, workers, batch size, channels_last, optimizer fusion,
checkpointing, persistent workers, threads), in one run and interleaved:

  trial   `autotune.trial.processes.launcher.run_trial`: the isolated measured trial a search runs (warm-up steps
          excluded, --seconds measured)
  train   `python -m autotune train --config cfg.json --epochs 3 --out DIR` in its own process group,
          as a user would run it; its samples/s is read from DIR/train.json (what it prints per epoch:
          synchronized, data loading included, validation excluded). Two figures: all 3 epochs (what the
          user gets, worker start-up and the first slow steps included) and epochs 2-3 (steady state)

and prints the Spearman rank correlation between trial and train (goal >= 0.9; scipy if it is
installed, else by hand with average ranks for ties) and the mean and median ratio trial/train.

Scale: so that 20 measurements fit in ~15 minutes on a 2-core CPU, the default data set is small
(160 synthetic images of 320x240, 144 for training after autotune's 10% validation hold-out) and crops
are 64 px. At batch 16 an epoch is 9 steps; the trial's 10 s run over several such epochs.

    .venv/bin/python benchmarks/fidelity.py --seconds 10 --epochs 3

Exit code: 0 Spearman >= 0.9, 3 below it, 1 a trial or training run failed (the others are still reported).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks (shared load meter)

from repeatability import OtherLoad, shown_command  # noqa: E402

GOAL = 0.9
SMALL_DATA = dict(n=160, size=(320, 240), seed=0)
# name -> knobs that differ from TrialConfig's plain-PyTorch defaults. Chosen to spread over the knobs
# that matter on a CPU, and over a wide range of throughput.
CONFIGS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "bf16": {"precision": "bf16"},
    "w2": {"num_workers": 2},
    "warm-start": {
        "precision": "bf16",
        "num_workers": 2,
        "persistent_workers": True,
        "prefetch_factor": 2,
        "optimizer_fusion": "fused",
    },
    "bf16-w1-b4-cl": {"precision": "bf16", "num_workers": 1, "batch_size": 4, "channels_last": True},
    "b16-foreach": {"batch_size": 16, "optimizer_fusion": "foreach"},
    "bf16-w2-ckpt5": {"precision": "bf16", "num_workers": 2, "checkpoint_segments": 5},
    "w1-b4-1thread": {"num_workers": 1, "batch_size": 4, "num_threads": 1},
    "bf16-b16-cl-fused": {"precision": "bf16", "batch_size": 16, "channels_last": True, "optimizer_fusion": "fused"},
    "w2-b16-ckpt2-pers": {"num_workers": 2, "batch_size": 16, "checkpoint_segments": 2, "persistent_workers": True},
}


def ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties get the average of the ranks they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float:
    try:
        from scipy.stats import spearmanr

        return float(spearmanr(xs, ys).statistic)
    except ImportError:
        pass
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def train(cfg_path: Path, out: Path, epochs: int, timeout: float) -> dict[str, Any]:
    """`autotune train` as a user runs it, in its own process group, killed as a group on timeout."""
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "train",
        "--config",
        str(cfg_path),
        "--epochs",
        str(epochs),
        "--out",
        str(out),
    ]
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as f:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"autotune train timed out after {timeout:.0f} s (log {log})") from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # loader workers a dying leader left behind
            except ProcessLookupError:
                pass
    summary = out / "train.json"
    if code != 0 or not summary.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
        raise RuntimeError(f"autotune train exited {code}:\n{tail}")
    return dict(json.loads(summary.read_text())[0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--image-size", type=int, default=64, help="training crop size in px (default 64)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per trial (default 10)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed trial steps (default 3, as `autotune search`)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of `autotune train` (default 3)")
    p.add_argument("--only", help="comma-separated config names to run (default all): " + ", ".join(CONFIGS))
    p.add_argument(
        "--data",
        metavar="DIR",
        help="dataset folder (default: 160 synthetic images of 320x240 under studies/data, generated on first use)",
    )
    p.add_argument("--out-dir", metavar="DIR", help="trial and training folders (default: a fresh temp folder)")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a trial or training run is killed (default 600)"
    )
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.epochs < 2:
        p.error("--seconds must be > 0 and --epochs >= 2 (epochs 2..n are the steady-state figure)")
    if args.only and set(args.only.split(",")) - set(CONFIGS):
        p.error(f"--only: unknown config(s) {sorted(set(args.only.split(',')) - set(CONFIGS))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(shown_command(argv, __file__), flush=True)

    from autotune.core import errors
    from autotune.trial.processes import launcher
    from autotune.core.config import TrialConfig
    from autotune.pipelines.unet.data import ensure_data

    data = Path(args.data).resolve() if args.data else ensure_data(ROOT / "studies" / "data", **SMALL_DATA).resolve()
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="fidelity-"))
    base = TrialConfig(
        data_dir=str(data), image_size=args.image_size, seconds=args.seconds, warmup_steps=args.warmup_steps
    )
    names = args.only.split(",") if args.only else list(CONFIGS)
    print(
        f"data {data}, {args.image_size} px; {len(names)} configs, each a {args.seconds:g} s trial and a "
        f"{args.epochs}-epoch `autotune train`, interleaved; folders under {out_dir}",
        flush=True,
    )

    rows: dict[str, dict[str, Any]] = {}
    failures = 0
    t_all = time.monotonic()
    for i, name in enumerate(names):
        cfg = base.replace(**CONFIGS[name])
        cfg_path = out_dir / f"{name}.json"
        cfg_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(json.dumps(cfg.to_dict()))
        row: dict[str, Any] = {}
        # Alternate which goes first, so that neither always inherits the other's warm page cache.
        for kind in ("trial", "train") if i % 2 == 0 else ("train", "trial"):
            t0 = time.monotonic()
            try:
                with OtherLoad() as other:
                    if kind == "trial":
                        res = launcher.run_trial(cfg, out_dir / f"{name}-trial", args.timeout)
                        row["trial"] = float(res.samples_per_s or 0.0)
                    else:
                        summary = train(cfg_path, out_dir / f"{name}-train", args.epochs, args.timeout)
                        epochs = [float(h["samples_per_s"]) for h in summary["history"]]
                        row["epochs"] = epochs
                        row["train"] = float(summary["samples_per_s"])
                        later = summary["history"][1:]
                        row["train_steady"] = sum(h["samples"] for h in later) / sum(h["seconds"] for h in later)
            except (errors.TrialFailure, RuntimeError) as e:
                failures += 1
                print(f"{name:18s} {kind} FAILED: {e}", flush=True)
                continue
            row[f"{kind}_wall"] = time.monotonic() - t0
            row[f"{kind}_others"] = other.cpus
            row[f"{kind}_load"] = os.getloadavg()[0]
        if "trial" in row and "train" in row:
            rows[name] = row
            print(
                f"{name:18s} trial {row['trial']:7.2f}  train {row['train']:7.2f} (epochs "
                f"{' '.join(f'{e:.2f}' for e in row['epochs'])}; 2..{args.epochs}: {row['train_steady']:.2f}) samples/s  "
                f"trial/train {row['trial'] / row['train']:.2f}  wall {row['trial_wall']:.0f}+{row['train_wall']:.0f} s  "
                f"load {row['trial_load']:.1f}/{row['train_load']:.1f}  others {row['trial_others']:.2f}/{row['train_others']:.2f} CPUs",
                flush=True,
            )

    print(f"\n{len(rows)} of {len(names)} configs measured both ways in {time.monotonic() - t_all:.0f} s")
    if len(rows) < 3:
        print("too few configs for a rank correlation", file=sys.stderr)
        return 1
    trial = [r["trial"] for r in rows.values()]
    full = [r["train"] for r in rows.values()]
    steady = [r["train_steady"] for r in rows.values()]
    rho, rho_steady = spearman(trial, full), spearman(trial, steady)
    ratios = [t / f for t, f in zip(trial, full)]
    ratios_steady = [t / s for t, s in zip(trial, steady)]
    print(
        f"Spearman rank correlation trial vs train ({args.epochs} epochs): {rho:.3f}   "
        f"vs train epochs 2..{args.epochs}: {rho_steady:.3f}   (goal >= {GOAL})"
    )
    print(
        f"trial/train ratio: mean {statistics.fmean(ratios):.2f}, median {statistics.median(ratios):.2f}, "
        f"range {min(ratios):.2f}..{max(ratios):.2f}; vs epochs 2..{args.epochs}: mean {statistics.fmean(ratios_steady):.2f}, "
        f"median {statistics.median(ratios_steady):.2f}"
    )
    by_trial = sorted(rows, key=lambda n: -rows[n]["trial"])
    by_train = sorted(rows, key=lambda n: -rows[n]["train"])
    print(
        f"fastest by trial: {', '.join(by_trial[:3])}; by train: {', '.join(by_train[:3])}; "
        f"the trial's pick is #{by_train.index(by_trial[0]) + 1} in training"
    )
    loads = [r[k] for r in rows.values() for k in ("trial_load", "train_load")]
    others = [r[k] for r in rows.values() for k in ("trial_others", "train_others")]
    print(
        f"machine: load average {min(loads):.1f}..{max(loads):.1f}, other processes {min(others):.2f}..{max(others):.2f} "
        f"CPUs, on {os.cpu_count()} CPUs"
    )
    (out_dir / "fidelity.json").write_text(json.dumps(rows, indent=1))
    if failures:
        print(f"{failures} measurement(s) failed", file=sys.stderr)
        return 1
    return 0 if rho >= GOAL else 3


if __name__ == "__main__":
    sys.exit(main())
