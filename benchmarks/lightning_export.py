"""Does a Lightning search's speedup hold when the user applies the export in their own script?

Two measurements of one speedup, side by side:

  search   `autotune search --pipeline lightning:benchmarks.lightning_job:make --budget B --global-batch 8
           --confirm-top 1` in a fresh study, and the confirmed figure its best.yaml reports
           (`confirmed.speedup_median`: the median over the interleaved rounds of the winner's figure over the
           baseline's measured beside it in the same round). --search-args replaces the last two flags ('' for the search's defaults).
  user     outside autotune, as README tells a user to apply the export: `autotune export --format
           lightning -o tuned_lightning.py`, then the user's own script builds the LightningModule and
           LightningDataModule and runs `lightning.pytorch.Trainer(**base_kwargs).fit(...)` (baseline:
           the datamodule's own train DataLoader, batch 8, no workers, which is autotune's baseline) against
           `Trainer(**base_kwargs | trainer_kwargs).fit(...)` with the train DataLoader built with
           `**dataloader_kwargs` (tuned), both imported from tuned_lightning.py (importing it also runs
           its `torch.set_num_threads(N)` line when the winner set num_threads), the learning rate
           multiplied by the export's lr factor.

The user runs are timed by a small Callback: the first 3 optimizer steps are warm-up (as a search's
trial), then the clock (perf_counter, after torch.cuda.synchronize() where CUDA is present) runs from
the end of step 3 to the end of the last step, data loading included. Each run is a fresh process (its
loader workers and threads start clean) and trains the same number of samples: --steps batches of the
baseline's 8, so a config with a larger batch runs fewer, larger steps over the same epochs. Baseline
and tuned alternate within each of --rounds rounds, odd rounds in reverse order, so drift falls on both.

It prints the medians, the user's ratio, the search's, and whether they agree within 5%:
|r_user / r_search - 1| <= 0.05. Both ratios are the same statistic: the median over rounds of tuned / baseline
measured in the same round, so drift between rounds (minutes-long slow spells on a shared VM) cancels
in each ratio instead of moving one median; the ratio of the two medians is printed beside it.

    PYTHONPATH=. python benchmarks/lightning_export.py [--budget 5m] [--rounds 5] [--steps 300] [--out DIR]
                                                      [--search-args '--global-batch 8 --confirm-top 1']

Everything (study, search log, best.yaml, tuned_lightning.py, each run's log, result.json) goes under
--out, a new or empty folder (default: a temp folder). Exit code: 0 the two agree within 5%; 3 they do
not, or tuned_lightning.py's kwargs differ from best.yaml's `framework:`, or the search exported the
baseline itself (nothing to compare); 1 the search or a run failed; 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

PIPELINE = "lightning:benchmarks.lightning_job:make"
STUDY = "lightning-export"
EXPORT = "tuned_lightning.py"
WARMUP = 3  # untimed optimizer steps per run, as `autotune search` (--warmup-steps 3)
AGREE = 0.05
# The search's flags besides budget, study and storage. --global-batch 8 keeps every config at the baseline's
# optimizer step (batch 8, or 4 x 2 accumulated): the winner is a loader or thread change, checked by a
# cheap parity run, not a larger batch whose time-to-target check rarely fits a 5-minute budget.
# --confirm-top 1: three whole confirmation rounds (winner and baseline) fit in it, where the top 3 fit one.
DEFAULT_SEARCH_ARGS = "--global-batch 8 --confirm-top 1"
RUN_TIMEOUT_S = 900


class BadInput(Exception):
    """Exit 2 with this one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every bad input here
        self.exit(2, f"{self.prog}: bad input: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="lightning_export.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", default="5m", help="the search's --budget (default 5m)")
    p.add_argument("--rounds", type=int, default=5, help="user-run rounds, baseline and tuned in each (default 5)")
    p.add_argument(
        "--steps",
        type=int,
        default=300,
        help="timed samples per user run, in baseline batches of 8 (default 300: about 4.7 epochs)",
    )
    p.add_argument("--out", metavar="DIR", help="a new or empty folder for everything (default: a temp folder)")
    p.add_argument(
        "--search-args",
        default=DEFAULT_SEARCH_ARGS,
        metavar="ARGS",
        help=f"more `autotune search` flags, one shell-quoted string (default {DEFAULT_SEARCH_ARGS!r}; '' for the "
        "search's own defaults, with a longer --budget)",
    )
    # One user run, in its own process (the parent starts these).
    p.add_argument("--child", choices=["baseline", "tuned"], help=argparse.SUPPRESS)
    p.add_argument("--export", help=argparse.SUPPRESS)
    p.add_argument("--lr-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def load1() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def env() -> dict[str, str]:
    """The children's environment: this checkout first on the path (autotune and benchmarks.lightning_job)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("HF_HUB_OFFLINE", "1")
    return e


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[module] set to None
        return False


def check_input(args: argparse.Namespace) -> tuple[float, Path]:
    for module, what in (("lightning", "PyTorch Lightning"), ("PIL", "Pillow")):
        if not installed(module):
            raise BadInput(f"{what} is not installed ({module!r} cannot be imported): pip install .[frameworks]")
    from autotune.core.settings import parse_duration
    from autotune.core.errors import ConfigError

    try:
        budget = parse_duration(args.budget)
    except ConfigError as e:
        raise BadInput(str(e)) from None
    if args.rounds < 1:
        raise BadInput(f"--rounds {args.rounds}: at least 1")
    if args.steps < 1:
        raise BadInput(f"--steps {args.steps}: at least 1")
    try:
        extra = shlex.split(args.search_args)
    except ValueError as e:
        raise BadInput(f"--search-args {args.search_args!r}: {e}") from None
    owned = {"--pipeline", "--budget", "--study", "--studies-dir", "--storage"}
    if clash := sorted(a.split("=")[0] for a in extra if a.split("=")[0] in owned):
        raise BadInput(f"--search-args: {', '.join(clash)} is set by this script")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="lightning-export-"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"--out {out}: not a new or empty folder (the search needs a fresh study)")
    out.mkdir(parents=True, exist_ok=True)
    return budget, out


# ---- the search ------------------------------------------------------------------------------------------------


def search(budget: str, extra: list[str], out: Path) -> tuple[dict[str, Any], float]:
    """Run the search in a fresh study under `out`; returns best.yaml and the search's wall time."""
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--pipeline",
        PIPELINE,
        "--budget",
        budget,
        "--study",
        STUDY,
        "--studies-dir",
        str(out / "studies"),
        "--storage",
        str(out / "studies.db"),
        *extra,
    ]
    print(f"search: {shlex.join(cmd)}  (log {out / 'search.log'})", flush=True)
    t0 = time.monotonic()
    with (out / "search.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=out, env=env(), stdout=log, stderr=subprocess.STDOUT).returncode
    took = time.monotonic() - t0
    if rc != 0:
        tail = (out / "search.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"autotune search exited {rc} after {took:.0f} s; its log ends:\n  " + "\n  ".join(tail))
    for line in (out / "search.log").read_text(errors="replace").splitlines():
        if line.startswith(("trial ", "confirm", "parity", "autotune: the exported")):
            print(f"  | {line}")
    import yaml

    best_file = out / "studies" / STUDY / "best.yaml"
    if not best_file.is_file():
        raise RuntimeError(f"autotune search wrote no {best_file}")
    return yaml.safe_load(best_file.read_text()), took


def export(out: Path) -> Path:
    """`autotune export --format lightning`, as README's Lightning section runs it."""
    path = out / EXPORT
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "export",
        "--study",
        STUDY,
        "--storage",
        str(out / "studies.db"),
        "--format",
        "lightning",
        "-o",
        str(path),
    ]
    print(f"export: {shlex.join(cmd)}", flush=True)
    r = subprocess.run(cmd, cwd=out, env=env(), capture_output=True, text=True)
    if r.returncode != 0 or not path.is_file():
        raise RuntimeError(f"autotune export exited {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")
    return path


def search_ratio(best: dict[str, Any]) -> tuple[float, str]:
    confirmed = best.get("confirmed") or {}
    r = confirmed.get("speedup_median")
    if not r:
        raise RuntimeError(
            "best.yaml has no confirmed speedup (no `confirmed:` section: the budget left no whole "
            f"confirmation round?); speedup: {best.get('speedup')}. Give a longer --budget"
        )
    lo, hi = confirmed.get("speedup_range") or (math.nan, math.nan)
    return float(r), (
        f"x{r:.3f} confirmed (median of {confirmed.get('rounds')} round(s), range x{lo:.2f}-x{hi:.2f}; "
        f"winner {confirmed.get('samples_per_s_median'):.1f}, baseline "
        f"{confirmed.get('baseline_median'):.1f} samples/s)"
    )


# ---- one user run (child process) ------------------------------------------------------------------------------


def child(which: str, export_path: Path, steps: int, lr_scale: float, result: Path) -> int:
    """The user's own script: their module and datamodule, Lightning's Trainer, the export applied (tuned)."""
    import lightning.pytorch as pl
    import torch

    from benchmarks import lightning_job

    trainer_kwargs: dict[str, Any] = {}
    dataloader_kwargs: dict[str, Any] = {}
    lr = 1e-3  # the module's own learning rate
    if which == "tuned":
        sys.path.insert(0, str(export_path.parent))
        tuned = importlib.import_module(export_path.stem)  # runs its torch.set_num_threads(N) line, if any
        trainer_kwargs, dataloader_kwargs = dict(tuned.trainer_kwargs), dict(tuned.dataloader_kwargs)
        lr *= lr_scale  # the export's "# lr: multiply your learning rate by ..." note
    batch = dataloader_kwargs.get("batch_size", lightning_job.BATCH)
    per_step = batch * trainer_kwargs.get("accumulate_grad_batches", 1)
    timed = max(1, math.ceil(steps * lightning_job.BATCH / per_step))  # the same samples as the baseline's

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class Throughput(pl.Callback):
        """Samples/s from the end of optimizer step WARMUP to the end of the last, data loading included."""

        def __init__(self) -> None:
            self.step = 0
            self.samples = 0
            self.t0: float | None = None
            self.t1: float | None = None

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.t0 is not None and self.t1 is None:
                self.samples += len(batch[1])
            if trainer.global_step == self.step:  # accumulating: no optimizer step yet
                return
            self.step = trainer.global_step
            if self.step == WARMUP:
                sync()
                self.t0 = time.perf_counter()
            elif self.step == WARMUP + timed:
                sync()
                self.t1 = time.perf_counter()

    meter = Throughput()
    base_kwargs = dict(
        max_steps=WARMUP + timed,
        callbacks=[meter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    torch.manual_seed(0)
    model = lightning_job.Classifier(lr=lr)
    datamodule = lightning_job.Images(seed=0, dataloader_kwargs=dataloader_kwargs)
    trainer = pl.Trainer(**(base_kwargs | trainer_kwargs))
    trainer.fit(model, datamodule=datamodule)
    if meter.t0 is None or meter.t1 is None:
        print(f"the fit ended at step {meter.step}, before step {WARMUP + timed}", file=sys.stderr)
        return 1
    elapsed = meter.t1 - meter.t0
    result.write_text(
        json.dumps(
            {
                "which": which,
                "samples_per_s": meter.samples / elapsed,
                "samples": meter.samples,
                "seconds": elapsed,
                "timed_steps": timed,
                "batch_size": batch,
                "threads": torch.get_num_threads(),
                "trainer_kwargs": trainer_kwargs,
                "dataloader_kwargs": dataloader_kwargs,
                "lr": lr,
                "precision": str(trainer.precision),
                "num_workers": trainer.train_dataloader.num_workers,
            }
        )
    )
    return 0


def user_run(which: str, out: Path, r: int, steps: int, lr_scale: float, runs: Path | None = None) -> dict[str, Any]:
    """One fresh `Trainer.fit` of the rendered export in `out` (baseline or tuned, as a user runs it); its
    figures and log go to `runs` (default out/runs) as round-R-WHICH.json / .log."""
    runs = runs or out / "runs"
    result, log = runs / f"round-{r}-{which}.json", runs / f"round-{r}-{which}.log"
    result.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        which,
        "--export",
        str(out / EXPORT),
        "--steps",
        str(steps),
        "--lr-scale",
        repr(lr_scale),
        "--result",
        str(result),
    ]
    t0 = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(
            cmd, cwd=out, env=env(), stdout=f, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
        ).returncode
    if rc != 0 or not result.is_file():
        tail = log.read_text(errors="replace").splitlines()[-10:]
        raise RuntimeError(f"round {r} {which}: exited {rc}; its log ({log}) ends:\n  " + "\n  ".join(tail))
    return {**json.loads(result.read_text()), "wall_s": time.monotonic() - t0, "load": load1()}


# ---- main ------------------------------------------------------------------------------------------------------


def fmt_kwargs(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())


def measure(args: argparse.Namespace, budget_s: float, out: Path) -> int:
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"load at start: {uptime()}")
    print(
        f"out: {out}; search budget {args.budget} ({budget_s:.0f} s), then {args.rounds} round(s) x 2 user runs of "
        f"{args.steps} x 8 samples after {WARMUP} warm-up steps",
        flush=True,
    )

    best, took = search(args.budget, shlex.split(args.search_args), out)
    r_search, search_line = search_ratio(best)
    framework = best.get("framework") or {}
    if framework.get("library") != "lightning":
        raise RuntimeError(f"best.yaml has no Lightning `framework:` section: {framework!r}")
    print(
        f"search took {took:.0f} s; winner: trial {(best.get('study') or {}).get('trial')}, config "
        f"{fmt_kwargs({k: v for k, v in (best.get('config') or {}).items()})}"
    )
    print(f"search's speedup: {search_line}")
    from autotune.core.config import BASELINE

    baseline_exported = (best.get("config") or {}) == BASELINE.knobs()
    path = export(out)
    print(f"{path.name}, as exported:\n    " + "\n    ".join(path.read_text().splitlines()))
    lr_scale = float(framework.get("lr_scale") or 1.0)
    print(f"best.yaml framework: trainer_kwargs {fmt_kwargs(framework.get('trainer_kwargs') or {})}")
    print(
        f"                     dataloader_kwargs {fmt_kwargs(framework.get('dataloader_kwargs') or {})}; "
        f"lr x{lr_scale:.4g}",
        flush=True,
    )

    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "tuned": []}
    for r in range(args.rounds):
        for which in ("baseline", "tuned") if r % 2 == 0 else ("tuned", "baseline"):
            x = user_run(which, out, r, args.steps, lr_scale)
            runs[which].append(x)
            print(
                f"round {r} {which:8s} {x['samples_per_s']:8.1f} samples/s  {x['samples']:5d} samples in "
                f"{x['seconds']:5.1f} s  batch {x['batch_size']:3d}  workers {x['num_workers']}  threads "
                f"{x['threads']}  run {x['wall_s']:4.0f} s  load {x['load']}",
                flush=True,
            )
    tuned_run = runs["tuned"][0]
    mismatch = [
        f"{name}: export file {tuned_run[name]!r} != best.yaml {framework.get(name)!r}"
        for name in ("trainer_kwargs", "dataloader_kwargs")
        if tuned_run[name] != framework.get(name)
    ]
    for m in mismatch:
        print(f"WARNING: {m}")

    med = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in runs.items()}
    per_round = [t["samples_per_s"] / b["samples_per_s"] for b, t in zip(runs["baseline"], runs["tuned"])]
    r_user = statistics.median(per_round)  # as the search's confirmation: the median of paired ratios
    agreement = r_user / r_search - 1
    agree = abs(agreement) <= AGREE
    print(f"\nuser runs (Trainer.fit outside autotune; median of {args.rounds} round(s), samples/s)")
    for k in ("baseline", "tuned"):
        print(f"  {k:8s}  median {med[k]:8.1f}   per round: " + "  ".join(f"{x['samples_per_s']:.1f}" for x in runs[k]))
    print(
        f"  ratio    x{r_user:.3f} (median of the per-round ratios; tuned median / baseline median "
        f"x{med['tuned'] / med['baseline']:.3f}); per round: " + "  ".join(f"{x:.2f}" for x in per_round)
    )
    print(f"search     x{r_search:.3f} (best.yaml confirmed.speedup_median)")
    print(
        f"agreement  r_user / r_search - 1 = {agreement:+.1%}: "
        + ("within 5%: AGREE" if agree else "more than 5% apart: DISAGREE")
        + (
            "; INCONCLUSIVE all the same: the search exported the baseline itself, so both user runs trained one config"
            if baseline_exported
            else ""
        )
    )
    (out / "result.json").write_text(
        json.dumps(
            {
                "command": [sys.executable, *sys.argv],
                "budget": args.budget,
                "rounds": args.rounds,
                "steps": args.steps,
                "search_ratio": r_search,
                "confirmed": best.get("confirmed"),
                "framework": framework,
                "config": best.get("config"),
                "runs": runs,
                "medians": med,
                "user_ratio": r_user,
                "per_round_ratios": per_round,
                "agreement": agreement,
                "agree": agree,
                "baseline_exported": baseline_exported,
                "export_mismatch": mismatch,
            },
            indent=1,
        )
    )
    print(f"load at end: {uptime()}")
    return 0 if agree and not mismatch and not baseline_exported else 3


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args.child, Path(args.export), args.steps, args.lr_scale, Path(args.result))
    try:
        budget_s, out = check_input(args)
    except BadInput as e:
        print(f"lightning_export.py: bad input: {e}", file=sys.stderr)
        return 2
    try:
        return measure(args, budget_s, out)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"lightning_export.py: {e}", file=sys.stderr)
        print(f"load at end: {uptime()}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
