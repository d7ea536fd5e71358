"""The end of a search, once its trials are spent: the plan (search/loop/plan.py: a leading class checked
before its rounds, no round on a config that could not then be exported), confirmation (the planned
configs and the baseline re-measured side by side in interleaved rounds), the parity gate (the export
candidates checked to train like the baseline), the extension rounds (a config the gate passed that the
rounds did not measure), and the export's ceiling (its compute-only rate and FLOPs utilisation).
The trial loop never uses it; `confirm_and_gate` is the one sequence, each step spending what the `Budget`
allows. The export itself (best.yaml) is the session's (`SearchSession.export_best`), after it.

May import: autotune.core, autotune.trial, and the rest of autotune.search (never the session).
"""

from __future__ import annotations

from collections.abc import Callable

import optuna

from autotune.core.settings import SearchSettings
from autotune.search.store.records import ConfirmationSummary
from autotune.core.paired import MIN_ROUNDS
from autotune.search.budget import Budget, confirm_rounds, least_confirming_budget_s
from autotune.search.loop import confirm, export_ceiling
from autotune.search.loop import gate, plan
from autotune.search.store.results import choose
from autotune.trial.processes.warm_client import WarmServer


def wanted(settings: SearchSettings) -> bool:
    """Whether a search ends with anything after its trials (--confirm-rounds or --parity-steps)."""
    return bool(settings.confirm_rounds or settings.parity_steps)


def reserve_note(settings: SearchSettings, budget: Budget) -> str | None:
    """What the budget keeps for the end of the search, said up front; None when it keeps nothing."""
    if not budget.reserve_s:
        return None
    s = settings
    return (
        f"confirmation: {budget.reserve_s:.0f} s of the budget kept to re-measure the top {s.confirm_top} "
        f"and the baseline in {confirm_rounds(s)} interleaved rounds (--confirm-rounds 0: off) and to check "
        f"that the winner trains like the baseline over {s.parity_steps} steps (--parity-steps 0: off)"
        + (", then to measure its ceiling" if budget.ceiling_reserve_s else "")
    )


def short_note(settings: SearchSettings, budget: Budget, trial_s: float | None) -> str | None:
    """After trial 0, at its measured launch-to-result seconds (`trial_s`: what a confirmation trial costs):
    the line that says the end share cannot pay for MIN_ROUNDS rounds of one config beside the baseline, so
    only the baseline's own config can be exported, with the budget that can; for a script study whose
    rounds fit only with its alone rounds' share, that line (_alone_note); None when the rounds fit (a guess
    made before any trial ran said so at 6 minutes, and 3 rounds then ran and exported a change)."""
    if not trial_s or not budget.reserve_s or settings.budget_s is None:
        return None
    least = least_confirming_budget_s(settings, trial_s)
    if least is None:
        return None
    if least <= settings.budget_s:
        return _alone_note(settings, budget, trial_s)
    return (
        f"confirmation: at {trial_s:.0f} s a trial (trial 0's, launch to result), the "
        f"{budget.reserve_s + budget.alone_reserve_s:.0f} s kept "
        f"pay for fewer than {MIN_ROUNDS} rounds of even one config beside the baseline, and fewer cannot show a "
        f"gain: this search can export only the baseline's own config; --budget {least / 60:.0f}m or more pays "
        "for them"
    )


def _alone_note(settings: SearchSettings, budget: Budget, trial_s: float) -> str | None:
    """For a script study whose rounds fit only with the alone rounds' share: a change would be exported on
    the rounds' figure, the script never run alone against it; said after trial 0 with the budget that pays
    for both. None where both fit, or where no alone rounds are kept."""
    both = least_confirming_budget_s(settings, trial_s, alone_kept=True) if budget.alone_reserve_s else None
    if both is None or settings.budget_s is None or both <= settings.budget_s:
        return None
    return (
        f"alone: at {trial_s:.0f} s a trial, {MIN_ROUNDS} rounds of a config beside the baseline fit only in the "
        f"alone rounds' share too: a change would be exported on the rounds' figure, your script not run alone "
        f"against it; --budget {both / 60:.0f}m or more pays for both"
    )


def confirm_and_gate(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None = None,
    *,
    server: WarmServer | None = None,
    say: Callable[[str], None] = print,
) -> ConfirmationSummary | None:
    """Plan the end (checking a leading class first where that pays), confirm, check parity, confirm the
    export too when the gate passed a config the rounds did not measure, and measure how far the export is
    from its ceiling. Returns the confirmation summary (search/store/records/verdicts.py), None when confirmation
    did not run or had nothing to compare."""
    confirmation = None
    unpaid: dict[str, plan.Unpaid] = {}
    if settings.confirm_rounds:  # without rounds, the gate alone decides, in the search's order
        planned = plan.ahead(study, settings, budget, server=server, say=say)
        unpaid = planned.unpaid
        confirmation = confirm.run(study, settings, budget, pool=planned.pool, server=server, say=say)
    gate.run(study, settings, budget, server=server, say=say, unpaid=unpaid)
    # The gate may have passed a config the rounds did not measure: exported only once its own rounds
    # show a gain, so it is confirmed beside the baseline now.
    best = choose(study, gain=False).trial if confirmation else None
    if best is not None:
        confirmation = confirm.extend(study, settings, best.number, budget, server=server, say=say)
    export_ceiling.run(study, settings, budget, say=say)  # last: the export is decided
    return confirmation


__all__ = ["confirm", "confirm_and_gate", "export_ceiling", "gate", "plan", "reserve_note", "short_note", "wanted"]
