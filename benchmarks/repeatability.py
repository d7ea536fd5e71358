"""How repeatable is one trial? The same config, N isolated trials, back to back: the spread of samples/s.

Every trial is a real isolated trial process started by `autotune.trial.processes.launcher.run_trial`, the path a
search takes. It prints each trial's samples/s with what can explain a spread:

  load      the 1-minute load average after the trial (the machines this runs on are shared)
  others    CPUs' worth of time used by *other* processes while the trial ran: all busy CPU time
            (/proc/stat) minus this process tree's own (its reaped trial, loader workers included),
            divided by the trial's wall time. 0.0 = the machine was ours; 1.0 = one core went elsewhere
  windows   the trial's per-window throughput: first window / median of the rest (warm-up too short
            if well below 1) and the spread of the rest (noise inside one trial)
  wait      the fraction of step time blocked on the loader; startup_s, process start to first step

and then the mean, stdev, coefficient of variation (goal <= 3%), median, and an analysis of what the
spread goes with. `--quiet-below X` waits (up to --quiet-wait s) before each trial until other
processes use less than X CPUs, so that a busy shared machine does not decide the result.

    .venv/bin/python benchmarks/repeatability.py --repeats 5 --seconds 15

Exit code: 0 when every trial finished and the CV is within the goal, 1 when a trial failed,
3 when all finished but the CV is over the goal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

GOAL_CV = 0.03
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------- machine load (shared helpers)


def _busy_cpu_s() -> float:
    """Busy CPU seconds on all CPUs since boot (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / _TICK


def _own_cpu_s() -> float:
    """CPU seconds of this process and its descendants: reaped ones via rusage, live ones via psutil."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    try:
        import psutil

        for p in psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    except ImportError:
        pass
    return total


class OtherLoad:
    """CPUs' worth of time used by other processes during a `with` block (ours subtracted)."""

    def __enter__(self) -> OtherLoad:
        self.busy0, self.own0, self.t0 = _busy_cpu_s(), _own_cpu_s(), time.monotonic()
        self.cpus = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(1e-6, time.monotonic() - self.t0)
        self.cpus = max(0.0, (_busy_cpu_s() - self.busy0 - (_own_cpu_s() - self.own0)) / wall)


def wait_for_quiet(below: float | None, max_wait_s: float, sample_s: float = 3.0) -> str:
    """Wait until other processes use less than `below` CPUs (sampled over `sample_s`), at most max_wait_s."""
    if below is None:
        return ""
    t0 = time.monotonic()
    while True:
        with OtherLoad() as o:
            time.sleep(sample_s)
        if o.cpus < below:
            return f"quiet after {time.monotonic() - t0:.0f} s ({o.cpus:.1f} CPUs busy elsewhere)"
        if time.monotonic() - t0 > max_wait_s:
            return f"NOT quiet after {max_wait_s:.0f} s ({o.cpus:.1f} CPUs busy elsewhere): measured anyway"


def shown_command(argv: list[str] | None, file: str) -> str:
    shown = [sys.executable, *sys.argv] if argv is None else [sys.executable, file, *argv]
    return "$ " + shlex.join(shown)


def load_config(path: str, base: Any) -> Any:
    """The knobs of a config file (flat TrialConfig or an exported best.yaml) over the workload `base`."""
    from autotune.core.configfile import load_config as _load

    return base.replace(**_load(path).knobs())


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = sum((x - mx) ** 2 for x in xs) ** 0.5
    sy = sum((y - my) ** 2 for y in ys) ** 0.5
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="take the knobs from a config file (e.g. an exported best.yaml); "
        "the workload (data, image size, seconds) still comes from the options here",
    )
    p.add_argument("--image-size", type=int, default=128, help="training crop size in px (default 128)")
    p.add_argument("--batch-size", type=int, default=8, help="default 8")
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"), help="default bf16")
    p.add_argument("--num-workers", type=int, default=2, help="default 2")
    p.add_argument("--num-threads", type=int, default=0, help="torch intra-op threads, 0 = torch's default (default 0)")
    p.add_argument("--persistent-workers", action="store_true", help="keep loader workers across epochs")
    p.add_argument("--repeats", type=int, default=5, help="trials (default 5)")
    p.add_argument(
        "--seconds",
        type=float,
        default=15.0,
        help="measured seconds per trial, after warm-up (default 15, as `autotune search`)",
    )
    p.add_argument(
        "--warmup-steps", type=int, default=3, help="untimed steps per trial (default 3, as `autotune search`)"
    )
    p.add_argument("--window", type=int, default=5, help="steps per throughput window (default 5, as a search)")
    p.add_argument(
        "--compare-env",
        action="append",
        metavar="KEY=VALUE",
        help="also run every round with this in the trial's environment, interleaved (A/B), "
        "e.g. OMP_WAIT_POLICY=PASSIVE; may be repeated (all go into one variant)",
    )
    p.add_argument(
        "--quiet-below",
        type=float,
        default=None,
        metavar="CPUS",
        help="before each trial, wait until other processes use fewer CPUs than this (default: don't wait)",
    )
    p.add_argument("--quiet-wait", type=float, default=120.0, metavar="S", help="longest wait for quiet (default 120)")
    p.add_argument("--data", metavar="DIR", help="dataset folder (default: the CLI's synthetic set under studies/data)")
    p.add_argument("--out-dir", metavar="DIR", help="where trial folders go (default: a fresh temp folder)")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds before a trial is killed (default seconds + 300)"
    )
    args = p.parse_args(argv)
    if args.repeats < 2 or args.seconds <= 0:
        p.error("--repeats must be >= 2 and --seconds > 0")
    if any("=" not in kv for kv in args.compare_env or []):
        p.error("--compare-env takes KEY=VALUE")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(shown_command(argv, __file__), flush=True)

    from autotune.core import errors
    from autotune.trial.processes import launcher
    from autotune.core.config import TrialConfig
    from autotune.pipelines.unet.data import default_data

    data = Path(args.data).resolve() if args.data else default_data(ROOT / "studies")
    base = TrialConfig(
        data_dir=str(data),
        image_size=args.image_size,
        seconds=args.seconds,
        warmup_steps=args.warmup_steps,
        window=args.window,
    )
    if args.config:
        cfg = load_config(args.config, base)
    else:
        cfg = base.replace(
            batch_size=args.batch_size,
            precision=args.precision,
            num_workers=args.num_workers,
            num_threads=args.num_threads,
            persistent_workers=args.persistent_workers,
        )
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="repeatability-"))
    timeout = args.timeout or args.seconds + 300
    knobs = " ".join(f"{k}={v}" for k, v in cfg.knobs().items())
    print(
        f"config: {knobs}\nworkload: {cfg.image_size} px, {cfg.warmup_steps} warm-up steps, {cfg.seconds:g} s measured, "
        f"window {cfg.window} steps; data {cfg.data_dir}; {args.repeats} trials, trial folders under {out_dir}",
        flush=True,
    )

    variants: list[tuple[str, dict[str, str]]] = [("as is", {})]
    if args.compare_env:
        variants.append((" ".join(args.compare_env), dict(kv.split("=", 1) for kv in args.compare_env)))
        print(
            f"A/B: every round runs the config as is and with {variants[1][0]} in the trial's environment, "
            "interleaved (odd rounds in reverse order)",
            flush=True,
        )
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    failures = 0
    t_all = time.monotonic()
    for i in range(args.repeats):
        for name, env in variants if i % 2 == 0 else variants[::-1]:
            quiet = wait_for_quiet(args.quiet_below, args.quiet_wait)
            if quiet:
                print(f"  ({quiet})", flush=True)
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # the launcher passes this process's environment to the trial
            t0 = time.monotonic()
            label = f"trial {i}" + (f" [{name}]" if len(variants) > 1 else "")
            try:
                with OtherLoad() as other:
                    res = launcher.run_trial(cfg, out_dir / f"t{i}-{variants.index((name, env))}", timeout)
            except errors.TrialFailure as e:
                failures += 1
                print(f"{label} FAILED ({e.reason}): {e}", flush=True)
                if e.log_tail:
                    print("  " + e.log_tail.replace("\n", "\n  "), flush=True)
                continue
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            w = list(res.windows)
            rest = w[1:]
            first_ratio = w[0] / statistics.median(rest) if len(rest) >= 1 else float("nan")
            w_cv = statistics.stdev(rest) / statistics.fmean(rest) if len(rest) >= 2 else float("nan")
            row = dict(
                sps=res.samples_per_s,
                p50=res.step_time_p50,
                p90=res.step_time_p90,
                wait=res.data_wait_fraction,
                steps=res.timed_steps,
                startup=res.startup_s,
                wall=time.monotonic() - t0,
                load=os.getloadavg()[0],
                others=other.cpus,
                first=first_ratio,
                wcv=w_cv,
                steady=statistics.median(rest) if rest else res.samples_per_s,
                windows=w,
            )
            rows[name].append(row)
            print(
                f"{label}  {res.samples_per_s:7.2f} samples/s  p50 {res.step_time_p50 * 1e3:5.0f} ms  "
                f"p90 {res.step_time_p90 * 1e3:5.0f} ms  wait {res.data_wait_fraction:4.0%}  {res.timed_steps:3d} steps  "
                f"startup {res.startup_s:4.1f} s  trial {row['wall']:3.0f} s  load {row['load']:.1f}  "
                f"others {other.cpus:.2f} CPUs  window1/rest {first_ratio:4.2f}  windows CV {w_cv:4.0%}",
                flush=True,
            )

    print(f"\n{sum(len(r) for r in rows.values())} trials in {time.monotonic() - t_all:.0f} s")
    cvs = {name: summarise(name if len(variants) > 1 else "", rs, cfg) for name, rs in rows.items()}
    (out_dir / "repeatability.json").write_text(json.dumps({"config": cfg.to_dict(), "trials": rows}, indent=1))
    if len(variants) > 1 and all(v is not None for v in cvs.values()):
        a, b = (statistics.median([r["sps"] for r in rows[n]]) for n, _ in variants)
        print(
            f"\nA/B: {variants[1][0]} / as is, ratio of medians {b / a:.2f}x; CV {cvs[variants[0][0]]:.1%} -> "
            f"{cvs[variants[1][0]]:.1%}"
        )
    if failures:
        print(f"\n{failures} trial(s) failed", file=sys.stderr)
        return 1
    cv = cvs[variants[0][0]]
    return 0 if cv is not None and cv <= GOAL_CV else 3


def summarise(title: str, rows: list[dict[str, Any]], cfg: Any) -> float | None:
    """Print the statistics and the analysis of one set of trials; returns the CV."""
    head = f"[{title}] " if title else ""
    if len(rows) < 2:
        print(f"{head}fewer than 2 trials finished: no statistics")
        return None
    sps = [r["sps"] for r in rows]
    mean, sd = statistics.fmean(sps), statistics.stdev(sps)
    cv = sd / mean
    print(
        f"\n{head}{len(rows)} trials: mean {mean:.2f} samples/s, stdev {sd:.2f}, "
        f"CV {cv:.1%} (goal <= {GOAL_CV:.0%}: {'met' if cv <= GOAL_CV else 'MISSED'}); median {statistics.median(sps):.2f}, "
        f"min {min(sps):.2f}, max {max(sps):.2f} (max/min {max(sps) / min(sps):.2f}x)"
    )
    steady = [r["steady"] for r in rows]
    print(
        f"  median of windows 2..n per trial (warm-up tail excluded): CV "
        f"{statistics.stdev(steady) / statistics.fmean(steady):.1%}"
    )
    others = [r["others"] for r in rows]
    loads = [r["load"] for r in rows]
    print(
        f"  machine: load average {min(loads):.1f}..{max(loads):.1f}, other processes {min(others):.2f}..{max(others):.2f} "
        f"CPUs during the trials, on {os.cpu_count()} CPUs"
    )
    r_other, r_load = pearson(others, sps), pearson(loads, sps)
    if r_other is not None:
        print(
            f"  correlation of samples/s with other processes' CPU {r_other:+.2f}"
            + (f", with the load average {r_load:+.2f}" if r_load is not None else "")
        )
    quiet_rows = [r for r in rows if r["others"] < 0.2]
    if len(quiet_rows) >= 2:
        q = [r["sps"] for r in quiet_rows]
        print(
            f"  trials with other processes < 0.2 CPUs: {len(quiet_rows)}, CV {statistics.stdev(q) / statistics.fmean(q):.1%}"
        )
    else:
        print(f"  {len(quiet_rows)} trial(s) ran with other processes < 0.2 CPUs: the machine was not ours")
    firsts = [r["first"] for r in rows if r["first"] == r["first"]]
    if firsts:
        m = statistics.median(firsts)
        print(
            f"  first window / rest, median {m:.2f}: "
            + ("warm-up too short (the first timed window is still slow)" if m < 0.9 else "warm-up long enough")
        )
    wcvs = [r["wcv"] for r in rows if r["wcv"] == r["wcv"]]
    if wcvs:
        print(f"  spread of windows inside one trial, median CV {statistics.median(wcvs):.0%}")
    waits = [r["wait"] for r in rows]
    print(
        f"  data wait {min(waits):.0%}..{max(waits):.0%} of step time; timed steps "
        f"{min(r['steps'] for r in rows)}..{max(r['steps'] for r in rows)}; start-up "
        f"{min(r['startup'] for r in rows):.1f}..{max(r['startup'] for r in rows):.1f} s"
    )
    if cfg.num_workers > 0 and cfg.num_threads == 0:
        print(
            f"  threads: torch runs {os.cpu_count()} intra-op threads plus {cfg.num_workers} loader worker process(es) "
            f"on {os.cpu_count()} CPUs, so the workers' decoding competes with the model's threads"
        )
    return cv


if __name__ == "__main__":
    sys.exit(main())
