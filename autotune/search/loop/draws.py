"""The baseline's further draws: trial 0's config measured once more, in a process of its own, before any
other trial, so that no speedup the search prints rests on one draw of the reference; and once more at the
middle of a long trial loop (LONG_S or more), since a machine's speed drifts over a long search. The first
further draw runs with the data seed + 1: the data-order twin that, with trial 0, is the reference every
class's check compares against (search/checks/riding.py), so the reference costs no run of its own.

On a machine whose processes each run at their own speed (a VM's steal time, a CPU's boost), one process
of a config can run 20-30% below another of the same config: an A/A control of a public script measured
x0.79..x1.21, and its trial 0 drew a slow process that inflated every speedup on the leaderboard. The
draws' median is the denominator of every speedup from here (search/store/results.baseline_sps), and
their spread is this machine's run-to-run noise for one config, said here and in best.yaml.

May import: autotune.core, autotune.trial, the rest of autotune.search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialFailure
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.checks import riding
from autotune.search.store.folders import trial_dir
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import baseline_figures, baseline_sps, baseline_spread
from autotune.trial.processes.locks import locked_trial
from autotune.trial.processes.warm_client import WarmServer

# The draws the baseline gets before the other trials: trial 0 and one more.
DRAWS = 2
# A trial loop at least this long draws the baseline once more at its middle.
LONG_S = 600.0


def wanted(study: optuna.Study, trial0: optuna.trial.FrozenTrial) -> bool:
    """Whether `trial0`, a baseline trial that just finished, still lacks a further draw: it measured, and
    the study has fewer than DRAWS draws of the baseline."""
    if trial0.state != optuna.trial.TrialState.COMPLETE or trial0.value is None:
        return False
    return 1 + len(records.baseline_draws(study)) < DRAWS


def due(study: optuna.Study, budget: Budget, now: float | None = None) -> bool:
    """Whether a long trial loop (LONG_S or more) has reached its middle without its mid-search draw."""
    deadline = budget.search_deadline
    if deadline is None or len(records.baseline_draws(study)) != DRAWS - 1:
        return False
    start = budget.trials_started if budget.trials_started is not None else budget.started
    length = deadline - start
    return length >= LONG_S and (time.monotonic() if now is None else now) >= start + length / 2


def draw(
    study: optuna.Study,
    settings: SearchSettings,
    trial0: optuna.trial.FrozenTrial,
    folder: Path,
    budget: Budget,
    server: WarmServer | None,
    say: Callable[[str], None],
) -> float | None:
    """Measure trial 0's config once more in a fresh process (forked from the warm server, as every trial),
    store the figure, and say the draws' median and spread; None when it did not fit or failed (said)."""
    record = TrialRecord.from_frozen(trial0)
    need = record.wall_s or (trial0.duration.total_seconds() if trial0.duration else 0.0)
    if not Budget.fits(need, budget.search_deadline):
        say(f"baseline: no further draw (about {need:.0f} s): the trials' share of the budget left is shorter")
        return None
    cfg = record.config_for(settings.base)
    where = folder / f"draw-{1 + len(records.baseline_draws(study))}"
    # The second draw is also the data-order twin of the classes' checks, when trial 0 recorded its half.
    first = riding.recorded(trial_dir(settings, trial0.number))
    twin = riding.twin(study, settings, cfg, first)
    try:
        if twin is None:
            figure = measure(cfg, where, settings, server)
        else:
            second, _ = locked_trial(twin, where, settings.trial_timeout, server=server)
            figure = float(second.samples_per_s or 0.0)
    except TrialFailure as e:
        say(f"baseline: a further draw failed ({e.reason}); speedups rest on the draws before it")
        return None
    if not figure:
        return None
    records.write_baseline_draw(study, figure)
    say(statement(study, figure))
    if twin is not None and first is not None and (ref := riding.store_reference(study, settings, first, second)):
        say(
            f"check: trial 0 and this draw (data seed + 1) are the reference of every class's check "
            f"({settings.parity_steps} steps each, {ref.seconds:.0f} s of steps past their windows, no run of their own)"
        )
    return figure


def measure(cfg: TrialConfig, folder: Path, settings: SearchSettings, server: WarmServer | None) -> float:
    """One measurement of `cfg` in a process of its own, as a trial runs it: its samples/s (0: none)."""
    result, _ = locked_trial(cfg, folder, settings.trial_timeout, server=server)
    return float(result.samples_per_s or 0.0)


def statement(study: optuna.Study, again: float) -> str:
    """The line that says the new draw, the draws so far, their median (every speedup's denominator from
    here) and their spread."""
    unit = records.throughput_unit(study)
    figures, median, spread = baseline_figures(study), baseline_sps(study), baseline_spread(study)
    others = ", ".join(f"{x:.2f}" for x in figures[:-1])
    noise = (
        f"; spread x{spread[0]:.2f}..x{spread[1]:.2f} of their median, this machine's noise for one config"
        if spread
        else ""
    )
    return (
        f"baseline: another draw in its own process ran {again:.2f} {unit} (the draws before: {others}): every "
        f"speedup from here is over their median, {median:.2f}{noise}"
    )
