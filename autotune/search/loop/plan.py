"""The end of a search, planned before it spends anything: which classes are checked before the rounds,
which configs the rounds measure, and which classes the budget left cannot check.

The end share is worth what it turns into an export. A round buys something only on a config that may
then be exported: one of the baseline's own training (it needs no check), or one whose training-math
class passed its check. README's 10-minute search once ran 3 rounds of its leading class's trials, then
found the class's check did not fit, said so once per trial of the class, and exported nothing, while a
same-math config sat outside the rounds. So, before any round:

* each unchecked class among the top --confirm-top configs, leading first, is checked now when its check
  and MIN_ROUNDS rounds of it beside the baseline fit in what the rounds may spend: its verdict comes
  before its rounds, and a failed class gets none;
* a class whose check cannot then fit gets no round. One line says so: what its check would cost, what is
  left, the configs it holds, and the budget that would pay for it; its configs are recorded `not
  checked` with that reason (by the gate), so the export's `passed_over:` names that budget too;
* the fastest config of the baseline's own training that beat the baseline stays a candidate, so the
  rounds can still export something when no check can be paid;
* where no config left may be exported, that is said before the rounds, and none runs.

May import: autotune.core, autotune.trial, and the rest of autotune.search (never the session).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from autotune.core.errors import TrialFailure
from autotune.core.outcomes import Verdict
from autotune.core.paired import MIN_ROUNDS
from autotune.core.settings import SearchSettings
from autotune.core.training import changes_step
from autotune.pipelines import kind_of
from autotune.search.budget import Budget, confirm_trial_s
from autotune.search.checks import classes
from autotune.search.loop.confirm import Candidate, candidates, searched_seconds
from autotune.search.store.folders import end_folder
from autotune.search.store.records import CheckRecord, TrialRecord
from autotune.search.store.results import class_check, class_label, leaderboard, needs_check
from autotune.trial.processes.warm_client import WarmServer

Say = Callable[[str], None]
# The most trials a class's line names; the rest are counted.
NAMED = 6


@dataclass(frozen=True)
class Unpaid:
    """A class whose check the budget left cannot pay for, with the rounds that must follow it before its
    configs could be exported."""

    label: str
    kind: str  # the check's own name: "time to target" when the class changes the optimizer step, else "parity"
    trials: tuple[int, ...]  # the configs it holds, fastest first
    check_s: float  # about what its check takes
    after_s: float  # MIN_ROUNDS rounds of it beside the baseline, when they are still to run; else 0
    left_s: float
    budget_s: float | None  # the run's --budget; None: no limit

    @property
    def need_s(self) -> float:
        return self.check_s + self.after_s

    def pays(self) -> str:
        """The --budget that would pay for it: this run's plus what it lacks, in whole minutes ("" without one).
        A longer run gives both the trials and the end more time, so its check runs in either."""
        if self.budget_s is None:
            return ""
        minutes = math.ceil((self.budget_s + self.need_s - self.left_s) / 60)
        return f"--budget {minutes}m pays for {'them' if self.after_s else 'it'}"

    def line(self) -> str:
        """The one line said for the class."""
        rounds = (
            f" and {MIN_ROUNDS} rounds of it beside the baseline (about {self.after_s:.0f} s)" if self.after_s else ""
        )
        pays = self.pays()
        return (
            f"{self.kind}: {self.label} ({held(self.trials)}): its check (about {self.check_s:.0f} s){rounds} "
            f"{'do' if self.after_s else 'does'} not fit in the {self.left_s:.0f} s left: not checked, so not exported"
            + (f"; {pays}" if pays else "")
        )

    def record(self) -> CheckRecord:
        """What each of its configs records: not checked, why, and the budget that would pay."""
        pays = self.pays()
        return {
            "kind": self.kind,
            "verdict": Verdict.NOT_CHECKED,
            "reason": f"the budget left ({self.left_s:.0f} s) was shorter than its check"
            + (" and the rounds after it" if self.after_s else "")
            + f" (about {self.need_s:.0f} s)"
            + (f"; {pays}" if pays else ""),
        }


@dataclass(frozen=True)
class Plan:
    """What the end spends its share on: the rounds' pool (configs best first, the baseline last), a class
    to check before them (its leading trial; None: none left to check first), the classes the budget left
    cannot check, and the classes that cannot be exported here at all, with why."""

    pool: list[Candidate]
    check: FrozenTrial | None
    unpaid: dict[str, Unpaid]
    left_out: dict[str, str]


def ahead(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None,
    *,
    server: WarmServer | None = None,
    say: Say = print,
) -> Plan:
    """The end planned: each class the plan checks first is checked, one at a time (a verdict can free or
    take time the next decision needs), then the final plan is said and returned for the rounds and the gate."""
    made: dict[str, CheckRecord] = {}
    while (plan := make(study, settings, budget, made)).check is not None:
        t = plan.check
        made[key(t)] = _check_first(study, settings, t, server, say)
    for label, why in plan.left_out.items():
        say(f"confirmation: {label} ({held(class_trials(study, label))}) left out: {why}, so not exported")
    for unpaid in plan.unpaid.values():
        say(unpaid.line())
    if not any(c.label != "baseline" for c in plan.pool) and (plan.unpaid or plan.left_out):
        say(
            "confirmation: no round runs: no config that may be exported beat the baseline in the search; "
            "the export is the baseline's own config"
        )
    return plan


def make(
    study: optuna.Study,
    settings: SearchSettings,
    budget: Budget | None,
    made: Mapping[str, CheckRecord] | None = None,
) -> Plan:
    """The plan as the study stands now (`made`: the checks `ahead` made, by `key`)."""
    made = made or {}
    board = candidates(study, settings.base, len(study.trials))  # distinct configs, failed classes out
    base = next((c for c in board if c.label == "baseline"), None)
    configs = [c for c in board if c is not base]
    rounds_s = 2 * MIN_ROUNDS * confirm_trial_s(settings, searched_seconds(study, board))
    deadline = _deadline(budget)
    pool: list[Candidate] = []
    unpaid: dict[str, Unpaid] = {}
    left_out: dict[str, str] = {}
    check: FrozenTrial | None = None
    for c in configs[: settings.confirm_top]:
        t, k = study.trials[c.trial], key(study.trials[c.trial])
        verdict = (made.get(k) or class_check(study, t) or {}).get("verdict")
        if not needs_check(study, t, settings.base) or verdict == Verdict.PASS:
            pool.append(c)
            continue
        if k in unpaid or k in left_out or (check is not None and key(check) == k):
            continue
        why = _never(settings, made.get(k) or class_check(study, t))
        if why is not None:
            left_out[k] = why
            continue
        if check is not None:  # a class after the one checked first: planned once that verdict is known
            continue
        cost = classes.cost_s(study, settings, t, TrialRecord.of(t).config_for(settings.base))
        if Budget.fits(cost + rounds_s, deadline):
            check = t
            continue
        unpaid[k] = Unpaid(
            k,
            check_name(settings, t),
            class_trials(study, k),
            cost,
            rounds_s,
            seconds_to(deadline),
            settings.budget_s,
        )
    _refill(study, settings, pool, configs, base, made)
    return Plan(sorted(pool, key=configs.index) + ([base] if base else []), check, unpaid, left_out)


def _refill(
    study: optuna.Study,
    settings: SearchSettings,
    pool: list[Candidate],
    configs: list[Candidate],
    base: Candidate | None,
    made: Mapping[str, CheckRecord],
) -> None:
    """Configs that may be exported, below the top, in place of the ones left out (up to --confirm-top), and
    the fastest config of the baseline's own training that beat the baseline, when none is in the pool: it
    is what the rounds can export when no check can be paid."""

    def exportable(c: Candidate) -> bool:
        t = study.trials[c.trial]
        return (
            not needs_check(study, t, settings.base)
            or (made.get(key(t)) or class_check(study, t) or {}).get("verdict") == Verdict.PASS
        )

    def same(c: Candidate) -> bool:
        return not needs_check(study, study.trials[c.trial], settings.base)

    for c in configs[settings.confirm_top :]:
        if len(pool) >= settings.confirm_top:
            break
        if exportable(c):
            pool.append(c)
    if not any(same(c) for c in pool):
        fastest = next((c for c in configs if same(c)), None)
        if fastest is not None and (base is None or fastest.search_sps > base.search_sps):
            pool.append(fastest)


def _check_first(
    study: optuna.Study, settings: SearchSettings, t: FrozenTrial, server: WarmServer | None, say: Say
) -> CheckRecord:
    """Check `t`'s class now, before any round (stored per class, as any class check); said with its verdict."""
    k, kind = key(t), check_name(settings, t)
    cfg = TrialRecord.of(t).config_for(settings.base)
    say(
        f"{kind}: {k} ({held(class_trials(study, k))}) leads: checked before its rounds by a run of its own "
        f"(about {classes.cost_s(study, settings, t, cfg):.0f} s): {classes.separate_why(study, settings, t)}"
    )
    try:
        check = classes.run_check(study, settings, t, cfg, end_folder(settings, study, "parity"), server)
    except TrialFailure as e:  # the baseline itself failed to train: nothing can be judged against it
        say(f"{kind}: not checked: the baseline failed to train ({e.reason})")
        return {"kind": kind, "verdict": Verdict.NOT_CHECKED, "reason": f"the baseline failed to train: {e.reason}"}
    words: dict[str, str] = {Verdict.PASS: "passes", Verdict.FAIL: "FAILS"}
    said = words.get(check["verdict"], "is not checked")
    say(
        f"{kind}: trial {t.number} {said}: {check.get('reason', '')} ({float(check.get('seconds') or 0):.0f} s)"
        + ("" if check["verdict"] == Verdict.PASS else "; its configs get no round")
    )
    return check


def _never(settings: SearchSettings, check: CheckRecord | None) -> str | None:
    """Why a class can never be exported by this search (its checks off, the job not checkable, a check that
    could not judge it), or None: a check could still pass it."""
    if not settings.parity_steps:
        return "its check is off (--parity-steps 0)"
    why = kind_of(settings.base.pipeline).why_not_checkable(settings.base)
    if why is not None:
        return f"not checkable: {why}"
    if check is not None and check.get("verdict") != Verdict.PASS:
        return f"its check did not pass ({check.get('reason', check.get('verdict'))})"
    return None


def _deadline(budget: Budget | None) -> float | None:
    """When a check made first and the rounds after it must end: the rounds' own end, or the budget's end for a
    script study, whose rounds take the alone rounds' share when they need it (confirm.deadline)."""
    if budget is None:
        return None
    return budget.end if budget.alone_reserve_s else budget.confirm_end


def seconds_to(deadline: float | None) -> float:
    """Seconds from now to `deadline` (a Budget property), never below 0; inf without one."""
    return float("inf") if deadline is None else max(0.0, deadline - time.monotonic())


def check_name(settings: SearchSettings, t: FrozenTrial) -> str:
    """The name of `t`'s class's check: time to target when it changes the optimizer step, else parity."""
    return "time to target" if changes_step(TrialRecord.of(t).config_for(settings.base)) else "parity"


def key(t: FrozenTrial) -> str:
    """A class's name: its training-math label; a trial of unknown math that changes the step is its own."""
    return class_label(t) or f"trial {t.number}"


def class_trials(study: optuna.Study, k: str) -> tuple[int, ...]:
    """The measured trials of class `k`, fastest first."""
    return tuple(t.number for t in leaderboard(study) if key(t) == k)


def held(trials: tuple[int, ...]) -> str:
    """A class's configs in words: "trial 3", or "trials 8, 6, 4" (the first NAMED, then how many in all)."""
    if len(trials) == 1:
        return f"trial {trials[0]}"
    named = ", ".join(str(n) for n in trials[:NAMED])
    return f"trials {named}" + (f", ... ({len(trials)} in all)" if len(trials) > NAMED else "")
