"""The README's plain-script example: the speedup a search reports for its best config, against the same
script run alone, as written and with the exported diff applied.

Two measurements of one speedup:

  search   `autotune search --script COPY --script-args "DATA --epochs N" --budget B` in a fresh study over
           a fresh `autotune make-data` set, and the figures its best.yaml reports: `speedup` (the search's
           last word: its own alone rounds' median, `alone.median`, when they ran; else the confirmed or
           the trial's), `alone.search_speedup` (the winner's trial over the baseline's) and, when
           confirmation ran, `confirmed.speedup_median` (the median over the interleaved rounds of the
           winner over the baseline measured beside it).
  alone    `autotune export --format diff` applied with `patch -p0` to a second copy of the script; then
           the copy as written (A) and the patched copy (B) each run as a user runs them, a fresh
           `python` process with no autotune trial around it (every `at.*` call is then the identity),
           alternated A B A B ..., the order reversed on odd rounds so drift falls on both sides.

Each alone run goes through the runner the search's own alone rounds use (`python -m
autotune.trial.probes.alone`), which runs the script with runpy as `__main__` and times it without editing
it: torch's global optimizer step post-hook stamps perf_counter at each step; the first --warmup steps
are dropped; steps/s and samples/s come from the next --steps steps, after which the hook ends the
script. Samples are counted from the batches the script's own DataLoader yielded (the first dimension of
each batch), so a diff that changed the batch is counted as it ran; the batch size each side's
DataLoader was built with is printed beside it.

It prints each round's ratio (patched / as written, samples/s, same round), their median and min..max,
the search's reported speedups, and the gap: the measured median / the reported one, with `uptime`'s
load before and after. A best that is the baseline exports "no change": both sides then run the same
script, a null check of the method.

Before the search, an A/A control (--aa rounds, 0: none): the script as written against a second copy of
itself, alternated the same way, so the machine's process-to-process noise is in view; then the search's
baseline draws (best.yaml's `baseline.search_draws`) are set against it, and each time-to-target class
the search passed is listed with its reason (the baseline's steps to its target).

Another script (`--script PATH --script-args "ARGS"`, a public repository's train.py): its folder is copied
whole twice (the script's sibling modules and its data with it), every command runs in the copy's folder
(the script's relative paths mean what they mean there), and no data is generated. The patched side runs
with the flags the export advises (best.yaml's `alone.patched_args`, when the study passed one the diff's
default cannot reach).

    PYTHONPATH=. python benchmarks/script_example.py [--budget 4m] [--rounds 5] [--aa 5] [--steps 60] [--out DIR]
    PYTHONPATH=. python benchmarks/script_example.py --script ~/nanoGPT/train.py --script-args "config/..." --steps 2000

Everything (data, the two copies, study, search log, tuned.diff, each run's log and JSON, result.json)
goes under --out, a new or empty folder (default: a temp folder). Exit code 0; 1 the search, the
export, the patch or a run failed; 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "external_pipeline" / "plain_script.py"
STUDY = "script-example"
SIDES = ("as written", "patched")
RUN_TIMEOUT_S = 600


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every bad input here
        self.exit(2, f"{self.prog}: bad input: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="script_example.py",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--budget", default="4m", help="the search's --budget (default 4m)")
    p.add_argument("--images", type=int, default=64, help="images `autotune make-data` writes (default 64)")
    p.add_argument("--px", type=int, default=96, help="their side in pixels, square (default 96)")
    p.add_argument("--size", type=int, default=64, help="the script's own --size: the side it trains at (default 64)")
    p.add_argument(
        "--epochs",
        type=int,
        default=2000,
        help="the script's --epochs, in the search: enough that no trial runs out of steps (default 2000)",
    )
    p.add_argument("--rounds", type=int, default=5, help="alone rounds, as written and patched in each (default 5)")
    p.add_argument(
        "--aa", type=int, default=5, help="A/A rounds before the search, the script against itself (default 5)"
    )
    p.add_argument("--script", metavar="PATH", help="another script to measure (default: the README's example)")
    p.add_argument("--script-args", default="", metavar="ARGS", help="its arguments, one shell-quoted string")
    p.add_argument("--warmup", type=int, default=3, help="untimed optimizer steps per alone run (default 3)")
    p.add_argument("--steps", type=int, default=60, help="timed optimizer steps per alone run (default 60)")
    p.add_argument("--out", metavar="DIR", help="a new or empty folder for everything (default: a temp folder)")
    p.add_argument(
        "--search-args",
        default="",
        metavar="ARGS",
        help="more `autotune search` flags, one shell-quoted string (default: none, the search's own defaults)",
    )
    return p.parse_args(argv)


def bad(message: str) -> NoReturn:
    """Bad input: exit 2 with one line."""
    sys.stderr.write(f"script_example.py: bad input: {message}\n")
    raise SystemExit(2)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def env() -> dict[str, str]:
    """The children's environment: this checkout first on the path, so `from autotune import script` is it."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def check_input(args: argparse.Namespace) -> tuple[list[str], Path]:
    from autotune.core.errors import ConfigError
    from autotune.core.settings import parse_duration

    try:
        parse_duration(args.budget)
    except ConfigError as e:
        bad(str(e))
    for name in ("images", "px", "size", "epochs", "rounds", "steps"):
        if getattr(args, name) < 1:
            bad(f"--{name} {getattr(args, name)}: at least 1")
    if args.warmup < 0 or args.aa < 0:
        bad(f"--warmup {args.warmup} / --aa {args.aa}: at least 0")
    if args.script and not Path(args.script).is_file():
        bad(f"--script {args.script}: no such file")
    try:
        shlex.split(args.script_args)
    except ValueError as e:
        bad(f"--script-args {args.script_args!r}: {e}")
    try:
        extra = shlex.split(args.search_args)
    except ValueError as e:
        bad(f"--search-args {args.search_args!r}: {e}")
    owned = {"--script", "--script-args", "--pipeline", "--budget", "--study", "--studies-dir", "--storage"}
    if clash := sorted({a.split("=")[0] for a in extra} & owned):
        bad(f"--search-args: {', '.join(clash)} is set by this script")
    if shutil.which("patch") is None:
        bad("`patch` is not installed (it applies the exported diff)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="script-example-"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        bad(f"--out {out}: not a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    return extra, out


# ---- one alone run: autotune's own runner (autotune/trial/probes/alone.py) ---------------------------------------


def alone(script: Path, script_args: list[str], args: argparse.Namespace, folder: Path, name: str) -> dict[str, Any]:
    """One fresh `python` process of `script` through the runner the search's alone rounds use; its figures,
    and its log's tail on failure. Run from `folder` (the round's), or from the script's own folder for
    another script (--script: its relative paths)."""
    from autotune.trial.probes.alone import AloneFailed, run_alone

    old = Path.cwd()
    os.chdir(script.parent if getattr(args, "script", None) else folder)
    try:
        return run_alone(script, script_args, args.warmup, args.steps, folder / f"{name}.json", timeout_s=RUN_TIMEOUT_S)
    except AloneFailed as e:
        raise RuntimeError(f"{name}: {e}") from None
    finally:
        os.chdir(old)


# ---- the search, the export, the patch --------------------------------------------------------------------------


def autotune(words: list[str], cwd: Path, log: Path) -> None:
    cmd = [sys.executable, "-m", "autotune", *words]
    print(f"$ {shlex.join(cmd)}  (log {log})", flush=True)
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=cwd, env=env(), stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"autotune {words[0]} exited {rc}; its log ends:\n  " + "\n  ".join(tail))


def prepare(args: argparse.Namespace, out: Path) -> tuple[Path, Path, list[str]]:
    """The data set and two copies of the example: `asis/` (searched, run as written) and `patched/`; for
    another script (--script), two copies of its whole folder and its own arguments."""
    if args.script:
        src = Path(args.script).resolve()
        copies = [
            Path(shutil.copytree(src.parent, out / folder, ignore=shutil.ignore_patterns(".git"))) / src.name
            for folder in ("asis", "patched", "aa")
        ]
        return copies[0], copies[1], shlex.split(args.script_args)
    data = out / "data"
    autotune(
        ["make-data", str(data), "--n", str(args.images), "--size", f"{args.px}x{args.px}"], out, out / "make-data.log"
    )
    copies = []
    for folder in ("asis", "patched", "aa"):
        (out / folder).mkdir()
        copies.append(Path(shutil.copy(EXAMPLE, out / folder / EXAMPLE.name)))
    return copies[0], copies[1], [str(data), "--size", str(args.size)]


def search(
    script: Path, script_args: list[str], args: argparse.Namespace, extra: list[str], out: Path
) -> dict[str, Any]:
    words = ["search", "--script", str(script), "--script-args", shlex.join(script_args), "--budget", args.budget]
    words += ["--study", STUDY, "--studies-dir", str(out / "studies"), "--storage", str(out / "studies.db"), *extra]
    t0 = time.monotonic()
    autotune(words, script.parent if args.script else out, out / "search.log")
    print(f"search took {time.monotonic() - t0:.0f} s; what it said of the space and the best:")
    for line in (out / "search.log").read_text(errors="replace").splitlines():
        if line.startswith(
            (
                "space: batch_size",
                "space: optimizer_fusion",
                "baseline:",
                "confirm",
                "parity: trial",
                "autotune: the exported",
            )
        ):
            print(f"  | {line}")
    import yaml

    best = out / "studies" / STUDY / "best.yaml"
    if not best.is_file():
        raise RuntimeError(f"autotune search wrote no {best}")
    return yaml.safe_load(best.read_text())


def export_and_patch(script: Path, patched: Path, out: Path) -> Path:
    """`export --format diff` from the searched copy's folder (so the diff names the file bare), applied to
    the other copy with `patch -p0`."""
    diff = out / "tuned.diff"
    autotune(
        ["export", "--study", STUDY, "--storage", str(out / "studies.db"), "--format", "diff", "-o", str(diff)],
        script.parent,
        out / "export.log",
    )
    text = diff.read_text()
    print("tuned.diff, as exported:\n    " + "\n    ".join(text.splitlines()), flush=True)
    if "+++ " not in text:  # "no change": the best is the baseline, both sides run the script as written
        return diff
    with diff.open() as f:
        r = subprocess.run(["patch", "-p0"], cwd=patched.parent, stdin=f, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"patch -p0 < {diff} exited {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}")
    return diff


def reported(best: dict[str, Any]) -> dict[str, Any]:
    """The speedups best.yaml reports: its own (the search's alone rounds' median, when they ran), the trial's,
    and the confirmed median and range when confirmation ran."""
    confirmed = best.get("confirmed") or {}
    alone = best.get("alone") or {}
    return {
        "speedup": best.get("speedup"),
        "alone": alone.get("median"),
        "alone_verdict": alone.get("verdict") or alone.get("skipped"),
        "search": alone.get("search_speedup"),
        "confirmed": confirmed.get("speedup_median"),
        "confirmed_range": confirmed.get("speedup_range"),
        "confirmed_rounds": confirmed.get("rounds"),
        "config": best.get("config"),
        "patched_args": alone.get("patched_args"),
        "baseline_draws": (best.get("baseline") or {}).get("search_draws"),
        "classes": ((best.get("checks") or {}).get("classes")),
    }


# ---- main --------------------------------------------------------------------------------------------------------


def rounds(
    copies: dict[str, Path],
    sides_args: dict[str, list[str]],
    args: argparse.Namespace,
    out: Path,
    n: int,
    name: str = "runs",
) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r in range(n):
        folder = out / name / f"round-{r}"
        folder.mkdir(parents=True)
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            got = alone(copies[side], sides_args[side], args, folder, side.replace(" ", "-"))
            runs[side].append(got | {"load": os.getloadavg()[0]})
            print(
                f"round {r} {side:10s} {got['samples_per_s'] or 0:8.1f} samples/s {got['steps_per_s']:7.2f} steps/s  "
                f"batch {got['batch_sizes']}  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    return runs


def figure(run: dict[str, Any]) -> float:
    """A run's figure: samples/s where its loaders counted samples, else steps/s (the search's unit rule)."""
    return float(run["samples_per_s"] or run["steps_per_s"])


def aa_control(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The script against itself: the machine's process-to-process noise for one config."""
    ratios = [figure(b) / figure(a) for a, b in zip(runs["as written"], runs["patched"])]
    xs = [figure(x) for side in SIDES for x in runs[side]]
    print(
        f"A/A control, {len(ratios)} rounds: copy / as written x{statistics.median(ratios):.3f} "
        f"(x{min(ratios):.3f}..x{max(ratios):.3f}); every run over their median "
        f"x{min(xs) / statistics.median(xs):.3f}..x{max(xs) / statistics.median(xs):.3f}",
        flush=True,
    )
    return {"ratios": ratios, "min": min(ratios), "max": max(ratios), "runs": xs}


def against_noise(said: dict[str, Any], aa: dict[str, Any] | None) -> None:
    """The spread of the search's baseline draws (best.yaml's `baseline.search_draws`, trial measurements)
    beside the A/A control's ratios (alone runs): the same config's process-to-process spread, measured two
    ways; and each time-to-target class the search passed, with its reason."""
    draws = said.get("baseline_draws")
    if draws and aa:
        spread = max(draws) / min(draws)
        lo, hi = aa["min"], aa["max"]
        width = max(hi, 1 / lo)
        print(
            f"search's baseline draws {', '.join(f'{x:.1f}' for x in draws)}: spread x{spread:.3f}; the A/A control's "
            f"ratios x{lo:.3f}..x{hi:.3f}: {'within' if spread <= width else 'WIDER than'} this machine's noise"
        )
    for label, check in (said.get("classes") or {}).items():
        print(f"class {label}: {check.get('kind')} {check.get('verdict')}: {check.get('reason')}")


def summary(runs: dict[str, list[dict[str, Any]]], said: dict[str, Any]) -> dict[str, Any]:
    ratios = [figure(p) / figure(a) for a, p in zip(runs["as written"], runs["patched"])]
    median = statistics.median(ratios)
    print("\nsamples/s (samples counted from the batches the script's DataLoader yielded; else steps/s), per round:")
    for side in SIDES:
        xs = [figure(x) for x in runs[side]]
        print(f"  {side:10s} median {statistics.median(xs):8.1f}   " + "  ".join(f"{x:.1f}" for x in xs))
    print(f"patched / as written, same round: median x{median:.3f}, min..max x{min(ratios):.3f}..x{max(ratios):.3f}")
    print("   per round: " + "  ".join(f"x{x:.3f}" for x in ratios))
    gaps = {}
    if said.get("alone_verdict"):
        print(f"search's own alone rounds: {said['alone_verdict']}")
    for name in ("speedup", "alone", "confirmed"):
        said_x = said.get(name)
        if said_x:
            gaps[name] = median / float(said_x)
            print(
                f"search's {name:9s} x{float(said_x):.3f}: measured / reported = {gaps[name]:.3f} ({gaps[name] - 1:+.1%})"
            )
        else:
            print(
                f"search's {name:9s} none in best.yaml"
                + (" (confirmation off, or no whole round fitted)" if name == "confirmed" else "")
                + (" (not a script study's export, or its rounds did not run)" if name == "alone" else "")
            )
    if said.get("confirmed_range"):
        lo, hi = said["confirmed_range"]
        print(f"  (confirmed over {said.get('confirmed_rounds')} round(s), range x{lo:.3f}..x{hi:.3f})")
    return {"ratios": ratios, "median": median, "min": min(ratios), "max": max(ratios), "gaps": gaps}


def measure(args: argparse.Namespace, extra: list[str], out: Path) -> int:
    print(f"command: {shlex.join([sys.executable, *sys.argv])}\nload at start: {uptime()}")
    print(
        f"out: {out}; {args.images} images at {args.px} px, trained at {args.size} px; search budget {args.budget}; "
        f"then {args.rounds} round(s) x 2 alone runs of {args.steps} timed steps after {args.warmup} warm-up steps",
        flush=True,
    )
    os.environ["PYTHONPATH"] = env()["PYTHONPATH"]  # the alone runs' processes import this checkout too
    asis, patched, script_args = prepare(args, out)
    # The search's own command line: its --epochs outlast the timed steps, after which the hook ends the run.
    alone_args = script_args if args.script else [*script_args, "--epochs", str(args.epochs)]
    aa = None
    if args.aa:
        copies = {"as written": asis, "patched": asis.parent.parent / "aa" / asis.name}
        aa = aa_control(rounds(copies, {side: alone_args for side in SIDES}, args, out, args.aa, "aa"))
    best = search(asis, alone_args, args, extra, out)
    said = reported(best)
    against_noise(said, aa)
    print(
        f"best: config {said['config']}; speedup {said['speedup']}, alone {said['alone']}, "
        f"confirmed {said['confirmed']}, search {said['search']}"
    )
    diff = export_and_patch(asis, patched, out)
    patched_args = list(said.get("patched_args") or alone_args)  # as the export tells the user to run it
    print(f"alone: python <copy> {shlex.join(alone_args)} (through the runner; the hook ends it after the timed steps)")
    if patched_args != alone_args:
        print(f"       the patched copy with the export's advice: {shlex.join(patched_args)}")
    sides_args = {"as written": alone_args, "patched": patched_args}
    runs = rounds({"as written": asis, "patched": patched}, sides_args, args, out, args.rounds)
    figures = summary(runs, said) | ({"aa": aa} if aa else {})
    load_end = uptime()
    print(f"load at end: {load_end}")
    record = {"reported": said, "runs": runs, "figures": figures, "diff": diff.read_text(), "load_end": load_end}
    (out / "result.json").write_text(json.dumps(record, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if str(ROOT) not in sys.path:  # run from a checkout without installing
        sys.path.insert(0, str(ROOT))
    extra, out = check_input(args)
    try:
        return measure(args, extra, out)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"script_example.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
