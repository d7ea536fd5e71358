"""What a search spends on checking training math, and whether it ends "no change" while a faster class it never
checked exists (issue 58: "An answer for the budget").

Runs `./launch.sh search --budget B ARGS...` in CHECKOUT (a clone of the revision to measure: main for the after,
an older commit for the before) --runs times, one at a time, each in a fresh folder under --out, and reads each
study back with this checkout's reader (it reads the class verdicts of either revision):

  checks   seconds spent on class checks: each class's stored verdict carries its seconds (a check run of its
           own, the reference's two runs included when it made them; a check that rode on its trial, the steps
           that trial ran past its window), plus the reference's seconds when trials carried it (the steps trial
           0 and the baseline's second draw ran past their windows). As a share of the budget.
  ending   the search's last word: a change exported, or "no change", and then whether a trial faster than the
           baseline sat in a class with no pass or fail verdict (a gain the budget found and could not export).

It prints one row per run and the medians, with `uptime`'s load before and after each run. Run it alone: a
test suite or another job beside it makes every trial slower and the budget buy less.

    python benchmarks/check_share.py --checkout /tmp/main --runs 3 --budget 10m --out /tmp/share/readme
    python benchmarks/check_share.py --checkout /tmp/main --runs 3 --budget 5m --out /tmp/share/script -- \\
        --script tests/trial/loop/script/scripts/unedited/train.py --script-args "--steps 1000000"

Exit code 0; 1 a search failed; 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna

from autotune.core.outcomes import Verdict
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import baseline_sps, class_label, feasible
from autotune.search.store.storage import open_storage


def load() -> str:
    """uptime's three load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spent_on_checks(study: optuna.Study) -> float:
    """Seconds the study's class checks took, the reference's included wherever it was paid for."""
    checks = sum(float(v.get("seconds") or 0.0) for v in records.class_checks(study).values())
    reference = records.parity_reference(study) or {}
    return checks + (float(reference.get("seconds") or 0.0) if reference.get("carried") else 0.0)


def unchecked_faster(study: optuna.Study) -> list[str]:
    """The classes holding a trial faster than the baseline with no pass or fail verdict."""
    base = float(baseline_sps(study) or 0.0)
    verdicts = records.class_checks(study)
    out: list[str] = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        label = class_label(t) if feasible(t) else None
        if not label or float(t.value or 0.0) <= base or TrialRecord.from_frozen(t).role == "baseline":
            continue
        if verdicts.get(label, {}).get("verdict") not in (Verdict.PASS, Verdict.FAIL) and label not in out:
            out.append(label)
    return out


def one(checkout: Path, folder: Path, budget: str, extra: list[str], venv: str | None) -> dict[str, object]:
    folder.mkdir(parents=True)
    storage = folder / "studies.db"
    cmd = ["./launch.sh", "search", "--budget", budget, "--storage", str(storage)]
    cmd += ["--studies-dir", str(folder / "studies"), *extra]
    # the checkout's own code: this reader's PYTHONPATH must not reach the search it measures
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | ({"AUTOTUNE_VENV": venv} if venv else {})
    before, t0 = load(), time.monotonic()
    with (folder / "search.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=checkout, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    wall, after = time.monotonic() - t0, load()
    text = (folder / "search.log").read_text()
    if rc != 0:
        print(f"search failed (exit {rc}): {folder / 'search.log'}", file=sys.stderr)
        sys.exit(1)
    study = optuna.load_study(study_name="autotune", storage=open_storage(str(storage)))
    budget_s = seconds(budget)
    unchanged = "no change exported" in text
    return {
        "wall_s": wall,
        "checks_s": spent_on_checks(study),
        "share": spent_on_checks(study) / budget_s,
        "no_change": unchanged,
        "unchecked_faster": unchecked_faster(study) if unchanged else [],
        "exported": next((line for line in text.splitlines() if line.startswith("autotune: the exported")), ""),
        "load": f"{before} -> {after}",
    }


def seconds(budget: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return float(budget[:-1]) * units[budget[-1]] if budget[-1] in units else float(budget)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkout", type=Path, required=True, help="the revision to measure (has launch.sh)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--budget", default="10m")
    p.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    p.add_argument("--venv", default=os.environ.get("AUTOTUNE_VENV"), help="AUTOTUNE_VENV for launch.sh")
    p.add_argument("extra", nargs="*", help="after --: more `autotune search` arguments")
    a = p.parse_args()
    if not (a.checkout / "launch.sh").is_file():
        print(f"check_share: {a.checkout} has no launch.sh", file=sys.stderr)
        return 2
    if a.out.exists() and any(a.out.iterdir()):
        print(f"check_share: {a.out} is not empty", file=sys.stderr)
        return 2
    rows = []
    for i in range(a.runs):
        r = one(a.checkout.resolve(), a.out / f"run-{i + 1}", a.budget, a.extra, a.venv)
        rows.append(r)
        ending = "no change" if r["no_change"] else "changed"
        if r["unchecked_faster"]:
            ending += f", faster class unchecked: {'; '.join(r['unchecked_faster'])}"  # type: ignore[arg-type]
        print(
            f"run {i + 1}: checks {r['checks_s']:.0f} s = {r['share']:.1%} of the budget; {ending}; "
            f"wall {r['wall_s']:.0f} s; load {r['load']}; {r['exported']}",
            flush=True,
        )
    shares = [float(r["share"]) for r in rows]  # type: ignore[arg-type]
    bad = sum(bool(r["unchecked_faster"]) for r in rows)
    print(
        f"{a.checkout} --budget {a.budget} {' '.join(a.extra)}: checks median {statistics.median(shares):.1%} of "
        f"the budget (min {min(shares):.1%}, max {max(shares):.1%}); {bad} of {len(rows)} ended no change "
        "with a faster class unchecked"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
