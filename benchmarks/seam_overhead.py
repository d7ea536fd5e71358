"""What autotune's seams cost an unedited script: the script as written against `autotune run` with the
baseline's config (no knob changed: the seams installed, overriding nothing), each run alone, in paired rounds.

Both sides are timed the same way, from outside and without editing the script: it prints one line per
optimizer step ("step N ..."), read as it is printed (PYTHONUNBUFFERED=1) and stamped with perf_counter on
arrival. A side's figure is its steps/s over the steps after --skip (the warm-up, the imports and
autotune's start-up outside it). Rounds alternate A B, B A, ... so the machine's drift falls on both
sides; each round's ratio is `autotune run` / as written, and the figure to quote is their median, with
min..max and the load before and after.

    PYTHONPATH=. python benchmarks/seam_overhead.py [--script PATH] [--script-args "ARGS"] [--rounds 6]

The default script is the unedited test script (a DataLoader, a conv stem, a ModuleList of blocks, AdamW,
its loss outside the model): tests/trial/loop/script/scripts/unedited/train.py. Exit code 0; 1 a run
failed; 2 bad input (one line).
"""

from __future__ import annotations

import argparse
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


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", type=Path, default=DEFAULT_SCRIPT)
    p.add_argument("--script-args", default="--steps 1500", help="its own arguments (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--skip", type=int, default=300, help="steps left out at the start of each run")
    p.add_argument("--out", type=Path, default=None, help="a folder for the config and the logs")
    a = p.parse_args(argv)
    if not a.script.is_file() or a.rounds < 1 or a.skip < 0:
        print(f"seam_overhead: need an existing --script, --rounds >= 1, --skip >= 0 (got {a.script})", file=sys.stderr)
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
    print(
        f"autotune run / as written: median x{statistics.median(ratios):.3f} (x{min(ratios):.3f}..x{max(ratios):.3f}) "
        f"over {len(ratios)} rounds; load {load()}; logs in {folder}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
