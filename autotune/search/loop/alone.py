"""A script study's last word: the script as written against the export applied, each run alone as
`python train.py ARGS` runs it, in paired rounds. The figure best.yaml, the final lines and the report
give is theirs; the trial loop's and confirmation's stay beside it as the search's.

After confirmation and the gate, when the export is not the script as written, the export is applied
to a copy of the script in the study's folder (`patch`: apply/export/patched.patched_copy, handed in by the
command, since the search does not import apply/) and the two are run alternately, A B B A ... (the
order reversed each round, so a drift falls on both sides), each a fresh process through
trial/probes/alone.py: no knob seams, no at.* trial, only a step clock, a fixed number of warm-up then
timed optimizer steps; samples/s from the batches the script's own DataLoader yielded (steps/s, said,
for a script without one). Each round's figure is the patched side over the script as written; the
rounds' median and sign-test interval (core/paired.py) decide: a gain only from MIN_ROUNDS rounds with
an interval clear of x1.00. When they cannot tell the two apart, or the patched script fails alone, the
export is "no change" (search/store/last_word.py).

The rounds are paid from the search's budget (search/budget.py keeps `alone_reserve_s` for them, said up
front): at least MIN_ROUNDS, more while another round fits by the late end, at most MAX_ROUNDS. When the
time left cannot pay for MIN_ROUNDS, or the script cannot run alone (a config on several GPUs, a script
that ends before its steps), they are skipped with the reason, and the search's export stands.

May import: autotune.core, autotune.trial, autotune.pipelines, and the rest of autotune.search.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Callable
from pathlib import Path
from typing import Any, Protocol

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import AutotuneError
from autotune.core.paired import MIN_ROUNDS, Paired, spread
from autotune.core.settings import SearchSettings
from autotune.pipelines import kind_of
from autotune.search.budget import ALONE_OVERHEAD_S, ALONE_TIMED_S, Budget
from autotune.search.store import last_word as store
from autotune.search.store.folders import end_folder
from autotune.search.store.records import StudyRecord, TrialRecord
from autotune.search.store.results import baseline_trial, choose, confirmed_figures
from autotune.trial.probes.alone import UNIT_SAMPLES, UNIT_STEPS, AloneFailed, run_alone

MAX_ROUNDS = 7  # enough for a 90% sign-test interval (from 5) and a margin; more rounds are the budget's waste
# Timed optimizer steps per run. The cap only bounds a run whose steps the trials measured far too slow: a
# script of 1.7 ms steps needs ~9,000 steps for ALONE_TIMED_S (a cap of 1,000 timed it 1.7 s, not 15).
MIN_STEPS, MAX_STEPS = 10, 100_000
GUESSED_STEP_S = 1.0  # a step's seconds where no trial measured one
PLAN_SHARE = 0.9  # of the time left, what MIN_ROUNDS rounds are planned to take: the rest absorbs start-up swings
SIDES = ("as_written", "patched")
THAN = "the script as written"


class PatchedScript(Protocol):
    """What `patch` returns (apply/export/patched.Patched): the user's script, its patched copy, its arguments and
    what the diff could not write into the copy."""

    original: Path
    copy: Path
    args: tuple[str, ...]
    notes: tuple[str, ...]
    copy_args: tuple[str, ...]
    model: Path | None


Patch = Callable[[TrialConfig, Path, "str | None", "Mapping[str, Any] | None"], PatchedScript]
Say = Callable[[str], None]


def reserve_note(budget: Budget) -> str | None:
    """The alone rounds' share of the budget, said up front beside confirmation's; None when none is kept."""
    if not budget.alone_reserve_s:
        return None
    return (
        f"alone: {budget.alone_reserve_s:.0f} s of the budget kept to run your script as written against it with "
        f"the export applied, each alone as `python` runs it, in at least {MIN_ROUNDS} paired rounds: their "
        "figure is the speedup exported"
    )


def run(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None,
    patch: Patch | None,
    say: Say = print,
) -> dict[str, Any] | None:
    """The alone rounds of the export against the script as written, their record written on the study
    (search/store/last_word.py) and returned; None where there is nothing to run (not a script study, no
    patcher handed in, no export, or the export is the script as written)."""
    if patch is None or not kind_of(settings.base.pipeline).runs_alone:
        return None
    best, baseline = choose(study).trial, baseline_trial(study)  # the search's: these rounds have the last word
    if best is None or baseline is None or best.number == baseline.number:
        return None
    workload = StudyRecord.of(study).workload or {}
    record = TrialRecord.from_frozen(best)
    cfg = TrialConfig.from_dict({**workload, **record.config})
    if cfg.knobs() == TrialConfig.from_dict({**workload, **TrialRecord.from_frozen(baseline).config}).knobs():
        return None
    head: dict[str, Any] = {"trial": best.number, "search_speedup": record.speedup}
    confirmed = confirmed_figures(study, best.number)
    if confirmed:
        head["confirmed_speedup"] = confirmed["speedup_median"]
    out = _rounds(study, settings, budget, patch, say, cfg, head, [best, baseline])
    store.write(study, out)
    say(f"alone: {said(out)}")
    return out


def _rounds(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None,
    patch: Patch,
    say: Say,
    cfg: TrialConfig,
    head: dict[str, Any],
    trials: list[optuna.trial.FrozenTrial],
) -> dict[str, Any]:
    """Plan the runs, apply the export to a copy, run the two alternately and tally their ratios; the record,
    or why it was skipped."""
    if cfg.gpus > 1:
        return head | {"skipped": f"a config on {cfg.gpus} GPUs runs under torchrun: its alone rounds run one process"}
    step_s = max(
        (float(s) for t in trials if (s := TrialRecord.from_frozen(t).metrics.get("step_time_p50"))),
        default=GUESSED_STEP_S,
    )
    # Both sides skip what the patched config's loaders make ahead, as the trial did: timed, those steps come free.
    warmup = cfg.untimed_steps
    deadline = budget.late_end if budget is not None else None
    left = math.inf if deadline is None else deadline - time.monotonic()
    steps = plan_steps(step_s, warmup, left)
    if steps is None:
        per_run = ALONE_OVERHEAD_S + (warmup + MIN_STEPS + 1) * step_s
        return head | {
            "skipped": f"the {max(left, 0):.0f} s the budget has left cannot pay for {MIN_ROUNDS} paired rounds of "
            f"two runs of ~{per_run:.0f} s each: the search's figure stands (a longer --budget runs them)"
        }
    folder = end_folder(settings, study, "alone")
    record = TrialRecord.from_frozen(trials[0])
    try:
        sites = (record.applied.get("script") or {}).get("sites")
        patched = patch(cfg, folder / "patched", str(record.metrics.get("device") or "") or None, sites)
    except AutotuneError as e:
        return head | {"skipped": f"the export could not be applied to a copy of the script: {e}"}
    head |= {
        "script": str(patched.original),
        "args": list(patched.args),
        **({"patched_args": list(patched.copy_args)} if patched.copy_args != patched.args else {}),
        "patched_copy": str(patched.copy),
        "not_in_the_diff": list(patched.notes),
        "warmup": warmup,
        "steps": steps,
    }
    timed = steps * step_s
    short = f", fewer than the {ALONE_TIMED_S:.0f} s planned: the budget left" if timed < 0.9 * ALONE_TIMED_S else ""
    head["timed_s"] = round(timed, 1)
    say(
        f"alone: {THAN} against the export applied ({patched.copy}), each a fresh `python` process, "
        f"{warmup} warm-up and {steps} timed optimizer steps per run (about {timed:.0f} s{short}), "
        f"at least {MIN_ROUNDS} rounds"
    )
    per_round = 2 * (ALONE_OVERHEAD_S + (warmup + steps + 1) * step_s)  # the plan, until a round has run
    runs, loads, ended = _alternate(patched, folder, warmup, steps, per_round, deadline, say)
    return head | (ended if ended is not None else _tally(runs, loads))


def _alternate(
    patched: PatchedScript,
    folder: Path,
    warmup: int,
    steps: int,
    per_round: float,
    deadline: float | None,
    say: Say,
) -> tuple[dict[str, list[dict[str, Any]]], list[float], dict[str, Any] | None]:
    """The paired rounds, A B B A ...: each side's runs, the load after each round, and the record's end when
    they stopped short (a side that failed, rounds that did not fit)."""
    scripts = {"as_written": patched.original, "patched": patched.copy}
    # The copy runs as the export tells the user to run it (a flag the study passed, given its new value).
    args = {"as_written": list(patched.args), "patched": list(patched.copy_args)}
    # The copy imports the modules the diff edited from its own folder, the user's others from theirs.
    homes = {"as_written": (patched.original.parent,), "patched": (patched.copy.parent, patched.original.parent)}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    loads: list[float] = []
    timeout = max(120.0, 5 * per_round)
    for r in range(MAX_ROUNDS):
        if r >= MIN_ROUNDS and not Budget.fits(per_round, deadline):
            break
        if r < MIN_ROUNDS and not Budget.fits(per_round * (MIN_ROUNDS - r), deadline):
            return runs, loads, {"skipped": f"only {r} of {MIN_ROUNDS} rounds fitted in the budget left"}
        t0 = time.monotonic()
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            out = folder / f"round-{r}" / f"{side}.json"
            try:
                got = run_alone(
                    scripts[side],
                    args[side],
                    warmup,
                    steps,
                    out,
                    home=homes[side],
                    timeout_s=timeout,
                    model=patched.model if side == "patched" else None,
                )
            except AloneFailed as e:
                if side == "patched":  # the diff breaks what runs as written: never a gain
                    return (
                        runs,
                        loads,
                        {
                            "measurable": False,
                            "verdict": f"the patched script failed alone: {e}",
                            "exported": "no change: the export applied does not run alone",
                        },
                    )
                return runs, loads, {"skipped": f"{THAN} did not run alone: {e}"}
            runs[side].append(got)
        per_round = time.monotonic() - t0 if r == 0 else max(per_round, time.monotonic() - t0)
        loads.append(round(os.getloadavg()[0], 2))
        a, b = runs["as_written"][-1], runs["patched"][-1]
        unit = unit_of(runs)
        say(
            f"alone round {r + 1}: as written {figure(a, unit):.1f}, patched {figure(b, unit):.1f} {unit}: "
            f"x{figure(b, unit) / figure(a, unit):.2f}  (load {loads[-1]:.2f})"
        )
    return runs, loads, None


def _tally(runs: dict[str, list[dict[str, Any]]], loads: list[float]) -> dict[str, Any]:
    """The rounds' ratios, their median and sign-test interval, the verdict and what the export becomes."""
    unit = unit_of(runs)
    ratios = [figure(b, unit) / figure(a, unit) for a, b in zip(runs["as_written"], runs["patched"])]
    own = [figure(a, unit) for a in runs["as_written"]]
    paired = Paired.of(ratios, spread(own)[1])  # the script's own spread in these rounds: the noise
    verdict = paired.statement(than=THAN)
    if unit == UNIT_STEPS:
        verdict += " (in steps/s: the script's batches come from no DataLoader to count)"
    return {
        **paired.to_dict(),
        "verdict": verdict,
        "unit": unit,
        "as_written": [figure(x, unit) for x in runs["as_written"]],
        "patched": [figure(x, unit) for x in runs["patched"]],
        "batch_sizes": {side: runs[side][0].get("batch_sizes") for side in SIDES},
        "load": loads,
        "exported": "the patched script" if paired.measurable else "no change: no measurable gain alone",
    }


def plan_steps(step_s: float, warmup: int, left: float) -> int | None:
    """Timed steps per run: about ALONE_TIMED_S of them (MIN_STEPS..MAX_STEPS), fewer where the time left
    would not pay for MIN_ROUNDS rounds of two runs (planned on PLAN_SHARE of it: a plan that fills the time
    left to the second no longer fits once the copy is patched); None when even MIN_STEPS would not."""
    steps = min(MAX_STEPS, max(MIN_STEPS, round(ALONE_TIMED_S / step_s)))
    if math.isfinite(left):
        per_run = PLAN_SHARE * left / (2 * MIN_ROUNDS)
        steps = min(steps, math.floor((per_run - ALONE_OVERHEAD_S) / step_s) - warmup - 1)
    return steps if steps >= MIN_STEPS else None


def unit_of(runs: dict[str, list[dict[str, Any]]]) -> str:
    """samples/s where every run counted its loader's samples, else steps/s for all (one unit per study)."""
    every = [x for side in SIDES for x in runs[side]]
    return UNIT_SAMPLES if every and all(x.get("samples_per_s") for x in every) else UNIT_STEPS


def figure(run: dict[str, Any], unit: str) -> float:
    return float(run["samples_per_s"] if unit == UNIT_SAMPLES else run["steps_per_s"])


def said(record: dict[str, Any]) -> str:
    """The record in one line: the verdict and what the export became, or why the rounds did not run."""
    if record.get("skipped"):
        return f"not run ({record['skipped']})"
    return f"{record['verdict']}; exported: {record['exported']}"
