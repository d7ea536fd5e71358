"""The parity gate: before a config is exported as best, it must train like the baseline.

Candidates are taken in export order (the confirmed order by median first, then the rest of the
leaderboard, fastest first). Each is checked as its training-math class is (search/checks/classes.py):
parity beside the baseline, or time to the baseline's loss when its optimizer step differs. A
candidate that fails is recorded in the study, said, and skipped, and the next one is checked. A class
already checked (during the search, or for an earlier candidate) is not checked again: its check
stands for every config in it. A config computing the baseline's own training needs no check: its
optimizer step is the baseline's by construction (core/training.SAME_MEANS), so the gate stops at it,
as the export does (results.choose). A check that does not fit in the budget left is not started (`not
checked`), said once for its class (what it would cost, what is left, the configs it holds, the budget
that would pay: search/loop/plan.Unpaid), and a cheaper candidate is tried: a config that passed is
exported before one that could not be checked (results.exported). The baseline's reference trajectory
is measured once per study and kept in the study, so a resumed search or another worker reuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import optuna
from optuna.trial import FrozenTrial

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.core.errors import TrialFailure
from autotune.core.outcomes import Role, Verdict
from autotune.search.checks import classes
from autotune.search.store import records
from autotune.search.budget import Budget
from autotune.search.loop import confirm, plan
from autotune.search.store.folders import end_folder
from autotune.search.store.records import CheckRecord, TrialRecord
from autotune.search.store.results import class_check, class_label, confirmed_figures, export_order, needs_check
from autotune.trial.processes.warm_client import WarmServer


INTRO = (
    "parity: each candidate trains {steps} optimizer steps beside the baseline (to the baseline's loss when its "
    "optimizer step differs), from the same weights on the same data, in fresh processes (--parity-steps 0: off)"
)


def _record_unpaid(short: Mapping[str, plan.Unpaid], checks: dict[str, CheckRecord]) -> None:
    """Each config of a class the budget cannot check records why it is not exported, and what budget pays."""
    for unpaid_class in short.values():
        for n in unpaid_class.trials:
            if (checks.get(str(n)) or {}).get("verdict") in (None, Verdict.NOT_CHECKED):
                checks[str(n)] = unpaid_class.record()


def run(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None = None,
    *,
    server: WarmServer | None = None,
    say: Callable[[str], None] = print,
    unpaid: Mapping[str, plan.Unpaid] | None = None,
) -> dict[str, CheckRecord] | None:
    """Check candidates until one passes; returns the checks by trial number (also stored in the
    study), or None when parity is off or there is nothing but the baseline to export. `unpaid`: the
    classes the end's plan found the budget cannot check (said there): their configs are recorded not
    checked, with no line."""
    steps, order = settings.parity_steps, _worth_checking(study)
    if not steps or not order:
        return None
    checks = records.gate_checks(study)
    folder = end_folder(settings, study, "parity")
    short = dict(unpaid or {})  # by class: a class the budget cannot check is said once, not once per config
    _record_unpaid(short, checks)
    said = False
    for t in order:
        key = str(t.number)
        if not needs_check(study, t, settings.base):
            say(f"parity: trial {t.number} computes the baseline's training (same): no check is needed")
            break
        standing = _standing(study, t, checks)
        if standing is not None:  # checked before (a resumed study), or its class was: its check stands
            checks[key] = standing
            if standing["verdict"] == Verdict.PASS:
                break
            continue
        cfg = TrialRecord.of(t).config_for(settings.base)
        k = plan.key(t)
        if k not in short and (lacking := _unpaid(study, settings, budget, t, cfg)) is not None:
            short[k] = lacking
            say(lacking.line())
        if k in short:
            checks[key] = short[k].record()
            continue
        if not said:  # said once a check runs, not before a search's end that checks nothing
            say(INTRO.format(steps=steps))
            said = True
        try:
            check = classes.run_check(study, settings, t, cfg, folder, server)
        except TrialFailure as e:  # the baseline itself failed to train: nothing can be judged against it
            say(f"parity: the baseline failed to train ({e.reason}); nothing exported is checked")
            checks[key] = {"verdict": Verdict.NOT_CHECKED, "reason": f"the baseline failed to train: {e.reason}"}
            break
        checks[key] = check
        records.write_gate_checks(study, checks)  # each check as it comes: an interrupt keeps the ones made
        _say_verdict(t, check, say)
        if check["verdict"] == Verdict.PASS:
            break
    records.write_gate_checks(study, checks)
    return checks


def _unpaid(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None,
    t: FrozenTrial,
    cfg: TrialConfig,
) -> plan.Unpaid | None:
    """The class of `t` when the budget left cannot pay for its check (and the rounds that confirm `t` beside
    the baseline, when the confirmation did not measure it: it is exported only once they show a gain); None
    when they fit."""
    check_s = classes.cost_s(study, settings, t, cfg)
    after_s = confirm.extension_s(study) if confirmed_figures(study, t.number) is None else 0.0
    deadline = budget.checks_end if budget else None
    if Budget.fits(check_s + after_s, deadline):
        return None
    k = plan.key(t)
    return plan.Unpaid(
        k,
        plan.check_name(settings, t),
        plan.class_trials(study, k),
        check_s,
        after_s,
        plan.seconds_to(deadline),
        settings.budget_s,
    )


def _say_verdict(t: FrozenTrial, check: CheckRecord, say: Callable[[str], None]) -> None:
    passed = check["verdict"] == Verdict.PASS
    words: dict[str, str] = {Verdict.PASS: "passes", Verdict.FAIL: "FAILS"}
    said = words.get(check["verdict"], "is not checked")
    say(
        f"{check['kind']}: trial {t.number} {said}: {check['reason']} ({check['seconds']:.0f} s)"
        + ("" if passed else "; the next best is checked instead")
    )


def _worth_checking(study: optuna.Study) -> list[FrozenTrial]:
    """The candidates in export order above the baseline: below it, the baseline itself would be exported."""
    ranked = export_order(study)
    roles = [TrialRecord.of(t).role for t in ranked]
    return ranked[: roles.index(Role.BASELINE)] if Role.BASELINE in roles else ranked


def _standing(study: optuna.Study, t: FrozenTrial, checks: dict[str, CheckRecord]) -> CheckRecord | None:
    """A check of `t` made before: its own verdict (a resumed study), or its class's (checked during the
    search, or for an earlier candidate); None when it has to be checked. Its own `not checked` is no verdict
    (the budget of the run that wrote it was short, or its baseline failed): it stands only as its class's."""
    own = checks.get(str(t.number))
    if own is not None and own.get("verdict") != Verdict.NOT_CHECKED:
        return own
    known = class_check(study, t)
    if known is None or known.get("trial") == t.number:  # none, or its own: no other trial to point to
        return known
    return {
        **known,
        "reason": f"its training math ({class_label(t)}) was checked at trial {known.get('trial')}: "
        f"{known.get('reason', '')}",
    }
