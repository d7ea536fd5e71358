"""Confirmation: before a winner is exported, the top configs and the baseline are measured again,
side by side, in interleaved rounds, each a fresh trial process.

One short measurement per config, taken at different moments, is what a search ranks by; machine
noise (another process, a thermal state, the page cache) moves single figures by several percent
and a contended one by far more. Alternating the order each round spreads slow drift evenly. A
config's speedup is the *median of its per-round ratios*: its figure over the baseline's measured
beside it in the same round, so drift between rounds (a shared VM's minutes-long slow spells) falls
on both sides of each ratio instead of on one median. The winner is the config with the best such
median, with the ratios' spread stated beside it (benchmarks/README.md, lightning_export.py, compares
the two readings with the user's own runs).

What the rounds can say is core/paired.py's: the sign test's interval for each config's median ratio,
and a gain only from MIN_ROUNDS (3) rounds with an interval clear of x1.00; no export changes anything
without one (search/store/results.choose). So the rounds are never fewer than 3, and when the budget
cannot pay for 3 rounds of every candidate, the lowest-ranked candidates are left out of the remaining
rounds, so the ones kept reach 3, rather than every candidate ending with a round or two that decide
nothing; when the budget cannot pay for 3 rounds of even the top one beside the baseline, none run.
Which configs are measured is the end's plan (search/loop/plan.py): only ones that may then be exported.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import optuna

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.errors import TrialFailure
from autotune.core.outcomes import Role
from autotune.search.store import records
from autotune.search.budget import Budget, confirm_rounds, confirm_trial_s
from autotune.core.paired import MIN_ROUNDS, Paired, spread
from autotune.search.store.folders import end_folder
from autotune.trial.processes.locks import locked_trial
from autotune.search.store.records import ConfirmationSummary, TrialRecord
from autotune.search.store.results import class_label, failed_classes, leaderboard
from autotune.trial.processes.warm_client import WarmServer


@dataclass(frozen=True)
class Candidate:
    label: str  # "trial 7" or "baseline"
    trial: int
    config: TrialConfig
    search_sps: float


def candidates(study: optuna.Study, workload: TrialConfig, top: int) -> list[Candidate]:
    """The top `top` feasible trials with distinct configs outside the failed training-math classes (never
    exported, so not worth a round), then the baseline (always measured: the speedup is a ratio of figures
    taken side by side, never of figures taken at different moments)."""
    failed = failed_classes(study)
    seen: set[str] = set()
    out: list[Candidate] = []
    baseline: Candidate | None = None
    for t in leaderboard(study):
        record = TrialRecord.from_frozen(t)
        key = repr(sorted(record.config.items()))
        if key in seen or (failed and class_label(t) in failed):
            continue
        seen.add(key)
        c = Candidate(
            "baseline" if record.role == Role.BASELINE else f"trial {t.number}",
            t.number,
            record.config_for(workload),
            float(t.value or 0),
        )
        if record.role == Role.BASELINE:
            baseline = c
        elif len(out) < top:
            out.append(c)
    return out + ([baseline] if baseline else [])


def run(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None = None,
    *,
    pool: list[Candidate] | None = None,
    server: WarmServer | None = None,
    say: Callable[[str], None] = print,
) -> ConfirmationSummary | None:
    """Measure `pool` (the end's plan, search/loop/plan.py; None: the top --confirm-top candidates) in up to
    --confirm-rounds interleaved rounds, only whole rounds that end by the budget's end (none: no limit);
    store and return the summary. None if there is nothing to compare (no feasible trial besides the
    baseline, rounds == 0, or not one round fits)."""
    rounds = confirm_rounds(settings)
    pool = candidates(study, settings.base, settings.confirm_top) if pool is None else pool
    if rounds == 0 or not any(c.label != "baseline" for c in pool):
        return None
    if rounds > settings.confirm_rounds:
        say(f"confirmation: {rounds} rounds, not {settings.confirm_rounds}: fewer cannot show a gain")
    say(f"confirming: {', '.join(c.label for c in pool)} in {rounds} interleaved round(s), each a fresh process")
    searched = searched_seconds(study, pool)
    figures, trial_s = _rounds(
        pool,
        rounds,
        end_folder(settings, study, "confirm"),
        settings,
        server,
        say,
        deadline(budget, confirm_trial_s(settings, searched), say),
        searched,
    )
    # Stored even when no round fitted: the search was to be confirmed, and an unconfirmed config is
    # then not exported (results.choose); the summary says 0 rounds.
    summary = summarize(pool, *tally(figures, pool), len(figures))
    summary["trial_s"] = trial_s
    records.write_confirmation(study, summary)
    return summary


def deadline(budget: Budget | None, trial_s: float, say: Callable[[str], None]) -> float | None:
    """When the rounds must end: the budget's end less the alone rounds' share; or, where that cannot pay
    for MIN_ROUNDS rounds of one config beside the baseline and the budget's end can, the budget's end. A
    script study's alone rounds measure only a change the rounds confirmed: without rounds they would not
    run, and the share kept for them would buy nothing (a 4-minute search ended after 130 s so)."""
    if budget is None:
        return None
    need = 2 * MIN_ROUNDS * trial_s
    if budget.alone_reserve_s and not Budget.fits(need, budget.confirm_end) and Budget.fits(need, budget.end):
        say(
            f"confirmation: takes the alone rounds' share ({budget.alone_reserve_s:.0f} s): without it no round "
            "fits, and without rounds nothing is exported that alone rounds would measure"
        )
        return budget.end
    return budget.confirm_end


def extend(
    study: optuna.Study,
    settings: SearchSettings,
    number: int,
    budget: Budget | None = None,
    *,
    server: WarmServer | None = None,
    say: Callable[[str], None] = print,
) -> ConfirmationSummary | None:
    """Confirm trial `number` too, when the export falls to a config the confirmation did not measure
    (the parity gate failed the ones it did): it and the baseline in --confirm-rounds interleaved rounds
    that end by the budget's late end (its end plus the grace; none: no limit). Its samples join the
    stored summary and the baseline's new samples join the baseline's, so every speedup stays a ratio of
    figures taken side by side. Returns the summary."""
    rounds = confirm_rounds(settings)
    summary = records.confirmation(study)
    if not summary or rounds == 0 or any(r["trial"] == number and r.get("samples") for r in summary["rows"]):
        return summary
    # Left out of the rounds (they did not fit it), or not among the configs they measured.
    left_out = any(r["trial"] == number for r in summary["rows"])
    board = {c.trial: c for c in candidates(study, settings.base, len(study.trials))}
    base = next((c for c in board.values() if c.label == "baseline"), None)
    if number not in board or base is None or board[number] is base:
        return summary
    pool = [board[number], base]
    trial_s = summary.get("trial_s") or confirm_trial_s(settings)
    deadline = budget.checks_end if budget else None
    if not Budget.fits(trial_s * len(pool) * MIN_ROUNDS, deadline):  # fewer rounds could not show a gain
        say(
            f"confirmation: {MIN_ROUNDS} rounds of {board[number].label} beside the baseline (about "
            f"{trial_s * len(pool) * MIN_ROUNDS:.0f} s) do not fit in the budget left: it is not exported"
        )
        return summary
    why = (
        "the confirmation's rounds did not fit it; its own may run into the budget's grace (the search ends "
        "within --budget + max(30 s, 2%))"
        if left_out
        else "it was not among the configs the rounds measured, none of which may be exported (no measurable gain, "
        "or training math that failed its check or was not checked)"
    )
    say(f"confirming the exported {board[number].label} too, beside the baseline: {why}")
    folder = end_folder(settings, study, "confirm") / f"trial-{number}"
    figures, _ = _rounds(pool, rounds, folder, settings, server, say, deadline, trial_s)
    if not figures:
        return summary
    new, new_ratios = tally(figures, pool)
    old = {r["label"]: r for r in summary["rows"]}
    samples = {label: list(r["samples"]) for label, r in old.items()}
    ratios = {label: list(r.get("ratios") or ()) for label, r in old.items()}
    samples[pool[0].label], ratios[pool[0].label] = new[pool[0].label], new_ratios[pool[0].label]
    samples["baseline"] = samples.get("baseline", []) + new["baseline"]
    merged = [c for c in board.values() if c.label in old and c.label not in ("baseline", pool[0].label)] + pool
    # Its rounds are rounds of their own beside the baseline: the count is of every round run.
    rounds_run = summary["rounds"] + len(figures)
    summary = {**summarize(merged, samples, ratios, rounds_run), "trial_s": summary.get("trial_s")}
    records.write_confirmation(study, summary)
    return summary


def extension_s(study: optuna.Study) -> float:
    """About how long `extend`'s fewest rounds take (MIN_ROUNDS rounds of a config and the baseline: fewer
    could not show a gain), from the confirmation's measured trial length; 0 when there was no
    confirmation to extend."""
    summary = records.confirmation(study)
    return 2 * MIN_ROUNDS * float(summary.get("trial_s") or 0) if summary else 0.0


def searched_seconds(study: optuna.Study, pool: list[Candidate]) -> float | None:
    """What one measurement of the pool costs, from the search's own trials of it (the median wall time,
    launch to result): a round is the same fresh processes, so the rounds left out or not begun are
    decided on this, not on a guess that lets a first round run that the rest cannot follow. None: none
    was timed."""
    walls = [TrialRecord.from_frozen(study.trials[c.trial]).wall_s for c in pool if c.trial < len(study.trials)]
    timed = [w for w in walls if w]
    return statistics.median(timed) if timed else None


def _rounds(
    pool: list[Candidate],
    rounds: int,
    folder: Path,
    settings: SearchSettings,
    server: WarmServer | None,
    say: Callable[[str], None],
    deadline: float | None,
    trial_s: float | None = None,
) -> tuple[list[dict[str, float | None]], float]:
    """Up to `rounds` interleaved rounds over `pool` (its configs best first, the baseline last), only
    whole rounds that fit before `deadline`: each round's figure by label (None: that measurement failed),
    and the measured seconds per trial. Before each of the first MIN_ROUNDS rounds, the lowest-ranked
    configs are left out of the rest when the budget cannot pay for MIN_ROUNDS rounds of them all: the
    ones kept can then show a gain. When it cannot pay for them of even the top config beside the
    baseline, no more rounds run: they could not show a gain, and the time is the user's."""
    figures: list[dict[str, float | None]] = []
    pool = list(pool)
    trial_s = trial_s or confirm_trial_s(settings)  # then measured
    for r in range(rounds):
        left = max(MIN_ROUNDS - r, 1)
        out = []
        while len(pool) > 2 and not Budget.fits(trial_s * len(pool) * left, deadline):
            out.append(pool.pop(-2))
        pays = r >= MIN_ROUNDS or Budget.fits(trial_s * len(pool) * left, deadline)
        if out or not pays:
            say(
                f"confirmation: the budget left pays for {'' if pays else 'fewer than '}{left} more round(s) of "
                f"{', '.join(c.label for c in pool)}"
                + (f"; {', '.join(c.label for c in reversed(out))} left out" if out else "")
                + f": fewer than {MIN_ROUNDS} rounds cannot show a gain"
                + ("" if pays else ", so none run")
            )
        if not pays or not Budget.fits(trial_s * len(pool), deadline):
            say(f"confirmation: {len(figures)} of {rounds} round(s) fit in the budget")
            break
        t0 = time.monotonic()
        figures.append(
            {  # alternate the order: drift falls on everyone
                c.label: _measure(c, folder / f"round-{r}" / c.label.replace(" ", "-"), settings, server, say)
                for c in (pool if r % 2 == 0 else pool[::-1])
            }
        )
        trial_s = (time.monotonic() - t0) / len(pool)
    return figures, trial_s


def tally(
    figures: list[dict[str, float | None]],
    pool: list[Candidate] = (),  # type: ignore[assignment]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The rounds' figures by label, and each config's ratios to the baseline measured in the same round
    (a round where either measurement failed has no ratio); every label of `pool` has an entry, empty
    when no round measured it."""
    labels = [c.label for c in pool] + [label for round_ in figures for label in round_]
    samples: dict[str, list[float]] = {label: [] for label in labels}
    ratios: dict[str, list[float]] = {label: [] for label in labels if label != "baseline"}
    for round_ in figures:
        base = round_.get("baseline")
        for label, x in round_.items():
            if x is not None:
                samples[label].append(x)
                if label != "baseline" and base:
                    ratios[label].append(x / base)
    return samples, ratios


def _measure(
    c: Candidate, trial_dir: Path, settings: SearchSettings, server: WarmServer | None, say: Callable[[str], None]
) -> float | None:
    try:
        result, _ = locked_trial(c.config, trial_dir, settings.trial_timeout, server=server)
    except TrialFailure as e:  # a config that fails now is not confirmed; the others still are
        say(f"  {c.label}: {e.reason}: {str(e)[:100]}")
        return None
    return float(result.samples_per_s or 0.0)


def summarize(
    pool: list[Candidate], samples: dict[str, list[float]], ratios: dict[str, list[float]], rounds: int
) -> ConfirmationSummary:
    """Medians and ranges over the rounds; each config's speedup the median of its per-round ratios to
    the baseline (`tally`) with the sign test's interval for it and its verdict (core/paired.py); the
    winner by that median among the configs measured in the most rounds, and whether the order of the
    search's figures held."""
    base = statistics.median(samples["baseline"]) if samples.get("baseline") else None
    # The baseline's own spread in these rounds: a gain thinner than it is no gain at 3-4 rounds (Paired).
    noise = spread(samples["baseline"])[1] if base else 1.0
    rows: list[dict[str, Any]] = []
    for c in pool:
        xs = samples[c.label]
        med = statistics.median(xs) if xs else None
        # The baseline's own row: its spread over its median, the rounds' noise in view.
        rs = [x / base for x in xs] if c.label == "baseline" and base else ratios.get(c.label, [])
        paired = Paired.of(rs, noise) if c.label != "baseline" and rs else None
        rows.append(
            {
                "label": c.label,
                "trial": c.trial,
                "search_samples_per_s": c.search_sps,
                "samples": xs,
                "samples_per_s_median": med,
                "min": min(xs) if xs else None,
                "max": max(xs) if xs else None,
                "ratios": rs,
                "speedup_median": statistics.median(rs) if rs else None,
                "speedup_range": [min(rs), max(rs)] if rs else None,
                # The sign test's interval for the median ratio, its coverage, and what it can say.
                "interval": list(paired.interval) if paired else None,
                "coverage": paired.coverage if paired else None,
                "measurable": bool(paired and paired.measurable),
                "verdict": paired.statement() if paired else None,
                "noise": noise,
            }
        )
    # More rounds first: a config the budget left out after a round or two never ranks above one measured
    # in more, however its median reads (one round ranked trial 2 above trial 7's three: a false reorder).
    ranked = sorted(
        (r for r in rows if r["label"] != "baseline" and r["speedup_median"]),
        key=lambda r: (-len(r["ratios"]), -r["speedup_median"]),
    )
    search_order = [c.label for c in pool if c.label != "baseline"]
    confirmed_order = [r["label"] for r in ranked]
    return {
        "rounds": rounds,
        "baseline_median": base,
        "rows": rows,
        "winner": ranked[0]["trial"] if ranked else None,
        "order_changed": confirmed_order != search_order[: len(confirmed_order)],
        "search_order": search_order,
        "confirmed_order": confirmed_order,
    }
