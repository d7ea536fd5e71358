"""What autotune's seams cost an unedited script: the script as written against `autotune run` with the
baseline's config (no knob changed: the seams installed, overriding nothing), each run alone, in paired rounds.

Both sides are timed the same way, from outside and without editing the script: it prints one line per
optimizer step ("step N ..."), read as it is printed (PYTHONUNBUFFERED=1) and stamped with perf_counter on
arrival. A side's figure is its steps/s over the steps after --skip (the warm-up, the imports and
autotune's start-up outside it). Rounds alternate A B, B A, ... so the machine's drift falls on both
sides; each round's ratio is `autotune run` / as written, and the figure to quote is their median, with
min..max and the load before and after.

    PYTHONPATH=. python benchmarks/seam_overhead.py [--script PATH] [--script-args "ARGS"] [--rounds 6]
        [--in-process ROUNDS]

Process to process, this 2-core machine's figure for one script is bimodal (one run ~355 steps/s, the next
~410, whichever side it is): a ratio of two processes carries that +-15%. `--in-process N` adds rounds that
cancel it: one process runs the script as written (runpy, as `python script.py` runs it) and then through
`autotune run`'s own path (run_whole, the seams installed over the baseline's config), alternating, N times
each, every run timed from its step lines as above; that process's ratios share its placement, and the
figure to quote is their median.

The default script is the unedited test script (a DataLoader, a conv stem, a ModuleList of blocks, AdamW,
its loss outside the model): tests/trial/loop/script/scripts/unedited/train.py. Exit code 0; 1 a run
failed; 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autotune.core.config import TrialConfig
from autotune.pipelines import load_pipeline, own_baseline, script
from autotune.trial.loop.script.baseline import is_as_written

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCRIPT = ROOT / "tests" / "trial" / "loop" / "script" / "scripts" / "unedited" / "train.py"
STEP = re.compile(r"^step (\d+)\b")


def baseline_config(path: Path, args: list[str], folder: Path) -> Path:
    """The config a search's trial 0 runs: the script's own knobs, so `autotune run` overrides nothing."""
    cfg = TrialConfig(pipeline=script.spec_of(str(path), args))
    own = own_baseline(load_pipeline(cfg))
    cfg = cfg.replace(**own, baseline=tuple(sorted(own.items())) or None)
    assert is_as_written(cfg), cfg.knobs()
    out = folder / "baseline.yaml"
    out.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return out


def steps_per_s(cmd: list[str], skip: int, log: Path) -> float:
    """Run `cmd`; its steps/s between the step lines after `skip` and its last, stamped as they arrive."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stamps: list[tuple[int, float]] = []
    with log.open("w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, env=env) as p:
        assert p.stdout is not None
        for line in p.stdout:
            t = time.perf_counter()
            f.write(line)
            if m := STEP.match(line):
                stamps.append((int(m.group(1)), t))
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {p.returncode}: see {log}")
    timed = [(n, t) for n, t in stamps if n >= skip]
    if len(timed) < 2:
        raise RuntimeError(f"{shlex.join(cmd)} printed {len(stamps)} step line(s), not more than --skip {skip}")
    (n0, t0), (n1, t1) = timed[0], timed[-1]
    return (n1 - n0) / (t1 - t0)


IN_PROCESS = r"""
import json, re, runpy, sys, time
from pathlib import Path

from autotune.core.configfile import load_config
from autotune.pipelines import script as spec
from autotune.trial.loop.script.running import run_whole

path, config, skip, rounds, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
cfg = load_config(config).replace(pipeline=spec.spec_of(path, args))
STEP = re.compile(r"^step (\d+)\b")


class Stamped:
    # The script's stdout, each step line stamped on arrival (as the two-process rounds stamp them).
    def __init__(self):
        self.stamps, self.part = [], ""

    def write(self, text):
        t, self.part = time.perf_counter(), self.part + text
        *lines, self.part = self.part.split("\n")
        self.stamps += [(int(m.group(1)), t) for line in lines if (m := STEP.match(line))]
        return len(text)

    def flush(self):
        pass


def timed(run):
    out, sys.stdout = sys.stdout, Stamped()
    try:
        run()
    finally:
        stamped, sys.stdout = sys.stdout, out
    steps = [(n, t) for n, t in stamped.stamps if n >= skip]
    (n0, t0), (n1, t1) = steps[0], steps[-1]
    return (n1 - n0) / (t1 - t0)


def as_written():
    argv, sys.argv = sys.argv, [path, *args]
    sys.path.insert(0, str(Path(path).parent))
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = argv
        sys.path.pop(0)


sides = {"as written": as_written, "autotune run": lambda: run_whole(cfg, time.time())}
for r in range(rounds):
    got = {side: timed(sides[side]) for side in (sides if r % 2 == 0 else reversed(list(sides)))}
    print(json.dumps(got), flush=True)
"""


def in_process(script: Path, args: list[str], config: Path, skip: int, rounds: int) -> list[float]:
    """Each in-process round's ratio, `autotune run`'s path / as written, both in one process."""
    cmd = [sys.executable, "-c", IN_PROCESS, str(script), str(config), str(skip), str(rounds), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if run.returncode != 0:
        raise RuntimeError(f"the in-process rounds exited {run.returncode}: {run.stderr[-2000:]}")
    ratios = []
    for r, line in enumerate(line for line in run.stdout.splitlines() if line.startswith("{")):
        got = json.loads(line)
        ratios.append(got["autotune run"] / got["as written"])
        print(
            f"in-process round {r}: as written {got['as written']:.1f} steps/s, autotune run's path "
            f"{got['autotune run']:.1f} steps/s, x{ratios[-1]:.3f}  load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    return ratios


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    p.add_argument("--script-args", default="--steps 1500", help="its own arguments (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--skip", type=int, default=300, help="steps left out at the start of each run")
    p.add_argument("--out", type=Path, default=None, help="a folder for the config and the logs")
    p.add_argument("--in-process", type=int, default=0, metavar="N", help="in-process rounds too (default 0)")
    a = p.parse_args(argv)
    if not a.script.is_file() or a.rounds < 0 or a.skip < 0 or a.in_process < 0:
        print(
            f"seam_overhead: need an existing --script, --rounds, --skip, --in-process >= 0 (got {a.script})",
            file=sys.stderr,
        )
        return 2
    folder = a.out or Path(tempfile.mkdtemp(prefix="seam-overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    args = shlex.split(a.script_args)
    config = baseline_config(a.script, args, folder)
    sides = {
        "as written": [sys.executable, str(a.script), *args],
        "autotune run": [sys.executable, "-m", "autotune", "run", "--config", str(config), str(a.script), *args],
    }
    print(f"seam_overhead: {a.script} {a.script_args}; {a.rounds} rounds; load {load()}", flush=True)
    ratios = []
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        got = {}
        try:
            for side in order:
                got[side] = steps_per_s(sides[side], a.skip, folder / f"round{r}-{side.replace(' ', '_')}.log")
        except RuntimeError as e:
            print(f"seam_overhead: {e}", file=sys.stderr)
            return 1
        ratios.append(got["autotune run"] / got["as written"])
        print(
            f"round {r}: as written {got['as written']:.1f} steps/s, autotune run {got['autotune run']:.1f} "
            f"steps/s, x{ratios[-1]:.3f}  load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    if ratios:
        print(
            f"autotune run / as written: median x{statistics.median(ratios):.3f} (x{min(ratios):.3f}..x{max(ratios):.3f}) "
            f"over {len(ratios)} rounds; load {load()}; logs in {folder}"
        )
    if a.in_process:
        try:
            inside = in_process(a.script, args, config, a.skip, a.in_process)
        except RuntimeError as e:
            print(f"seam_overhead: {e}", file=sys.stderr)
            return 1
        print(
            f"in one process, autotune run's path / as written: median x{statistics.median(inside):.3f} "
            f"(x{min(inside):.3f}..x{max(inside):.3f}) over {len(inside)} rounds; load {load()}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
