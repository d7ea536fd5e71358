"""Why a search's trials stop: the reasons (one per run, said and stored on the study), what the trial loop
counts for them, the check made before each ask, and the line that says it.

May import: autotune.core, autotune.pipelines, and the rest of autotune.search.
"""

from __future__ import annotations

import enum
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from autotune import pipelines
from autotune.core import outcomes
from autotune.core.outcomes import Reason
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.loop import admission
from autotune.search.store import records
from autotune.search.store.records import TrialRecord
from autotune.search.store.results import leaderboard

# Trials that fail on the data in a row before the search stops: every config would fail the same way. So
# would every config after as many failing with one message before any trial was measured (a script that
# raises before its first step, a pipeline that cannot build its model).
DATA_FAILURES_TO_STOP = 3
# Failures that say nothing of the config's code path: not counted as "the same failure again".
CIRCUMSTANTIAL = frozenset({Reason.TIMEOUT, Reason.BUDGET, Reason.INTERRUPTED, Reason.STALE, Reason.DISK})
# Proposals of already-measured configs in a row before the search ends: a small space is exhausted.
REPEATS_TO_STOP = 25


class Stop(str, enum.Enum):
    """Why a run's trials ended: one reason per run, said and stored on the study (its word)."""

    N_TRIALS = "n_trials"  # --n-trials trials ran
    BUDGET = "budget"  # the trials' share of the budget is spent, or the median trial would overrun what is left
    SPACE_EXHAUSTED = "space_exhausted"  # a listed space has no config left that can run
    SPACE_DEFERRED = "space_deferred"  # a listed space's configs left all need more time than this run has
    PROPOSALS_DEFERRED = "proposals_deferred"  # the sampler's draws all needed more time than this run has
    PROPOSALS_REPEATED = "proposals_repeated"  # REPEATS_TO_STOP proposals in a row were not run
    DATA_FAILURES = "data_failures"  # DATA_FAILURES_TO_STOP trials in a row failed on the data
    SAME_FAILURES = "same_failures"  # as many failed the same way before any was measured
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM
    DISK = "disk"  # the disk refused a write

    def __str__(self) -> str:
        return str(self.value)

    @property
    def job_failed(self) -> bool:
        """Every config would fail the same way: the job's fault (exit 2), nothing to confirm."""
        return self in (Stop.DATA_FAILURES, Stop.SAME_FAILURES)


@dataclass
class Tally:
    """What the trial loop has counted, which its stop checks read."""

    durations: list[float] = field(default_factory=list)  # of the trials run
    left_s: float = float("inf")  # the trials' time left at the last check
    unrun: int = 0  # proposals in a row told without running
    deferred: int | None = None  # the last proposal's trial, when it was deferred for the time left
    data_failures: int = 0  # trials in a row that failed on the data
    same_failures: int = 0  # trials in a row that failed with `cause`
    cause: tuple[str, str] | None = None  # (reason, message) of the last trial's failure, if its config's
    last: TrialRecord | None = None  # the last trial run
    space: Counter[str | None] = field(default_factory=Counter)  # a listed space's configs by why_not

    def ran(self, frozen: optuna.trial.FrozenTrial, seconds: float) -> None:
        record = TrialRecord.from_frozen(frozen)
        self.durations.append(seconds)
        self.unrun, self.deferred, self.last = 0, None, record
        self.data_failures = self.data_failures + 1 if record.reason == Reason.DATA else 0
        failed = records.outcome(frozen) in (outcomes.Outcome.FAILED, outcomes.Outcome.INFEASIBLE)
        cause = (str(record.reason), record.message) if failed and record.reason not in CIRCUMSTANTIAL else None
        self.same_failures = (self.same_failures + 1 if cause == self.cause else 1) if cause else 0
        self.cause = cause

    def told_unrun(self, number: int, why: str) -> None:
        self.unrun += 1
        self.deferred = number if why == admission.DEFERRED else None


def stop_now(tally: Tally, budget: Budget, settings: SearchSettings, study: optuna.Study) -> Stop | None:
    """Why the trials end now, before the next ask, or None: the job failing, then the proposals, then
    --n-trials, then the budget (the median trial so far must fit in what is left)."""
    if tally.data_failures >= DATA_FAILURES_TO_STOP:
        return Stop.DATA_FAILURES
    if tally.same_failures >= DATA_FAILURES_TO_STOP and not leaderboard(study):
        return Stop.SAME_FAILURES
    if tally.deferred is not None:
        return Stop.PROPOSALS_DEFERRED
    if tally.unrun >= REPEATS_TO_STOP:
        return Stop.PROPOSALS_REPEATED
    if settings.n_trials is not None and len(tally.durations) >= settings.n_trials:
        return Stop.N_TRIALS
    if budget.trials_over(tally.left_s, tally.durations):
        return Stop.BUDGET
    return None


def say_stop(stop: Stop, tally: Tally, settings: SearchSettings, say: Callable[[str], None]) -> str | None:
    """Say why the trials ended; a job's failure is returned instead, to be the run's error."""
    s, last = settings, tally.last or TrialRecord()
    if stop == Stop.DATA_FAILURES:
        return (
            f"{DATA_FAILURES_TO_STOP} trials in a row failed on the data ({last.message}); fix the "
            "data, or pass --skip-bad-data to leave undecodable items out"
        )
    if stop == Stop.SAME_FAILURES:
        cmd = pipelines.kind_of(s.base.pipeline).alone_command()
        alone = f" (run it alone to see: {cmd})" if cmd else ""
        return (
            f"{DATA_FAILURES_TO_STOP} trials in a row failed the same way before any was measured "
            f"({last.reason}: {last.message.splitlines()[0] if last.message else 'no message'}): every "
            f"config would: fix the job{alone}, then search again"
        )
    if stop in (Stop.SPACE_EXHAUSTED, Stop.SPACE_DEFERRED):
        counts = ", ".join(f"{n} {why}" for why, n in sorted(tally.space.items(), key=lambda kv: str(kv[0])))
        total = sum(tally.space.values())
        said = (
            f"none of the space's {total} configs left would finish in the time this run has left "
            f"({counts}); those deferred may run in a longer run of this study: the search ends here"
            if stop == Stop.SPACE_DEFERRED
            else f"the space is exhausted: each of its {total} configs was run or cannot be ({counts}), so "
            "the search ends here"
        )
    elif stop == Stop.PROPOSALS_DEFERRED:
        said = (
            f"trial {tally.deferred} was deferred, as were the sampler's other proposals: what it proposes "
            "needs more time than this run has left, so the search ends here"
        )
    elif stop == Stop.PROPOSALS_REPEATED:
        said = (
            f"the sampler proposed only configs already measured, in a failed class or too big for memory, "
            f"{tally.unrun} times in a row: the space looks exhausted, so the search ends here"
        )
    elif stop == Stop.N_TRIALS:
        said = f"the {s.n_trials} trial(s) asked for (--n-trials) have run"
    else:
        median = statistics.median(tally.durations) if tally.durations else 0.0
        said = (
            "the trials' share of the budget is spent"
            if tally.left_s <= 0
            else f"the median trial ({median:.0f} s) would overrun the {tally.left_s:.0f} s the trials have left"
        )
    say(f"autotune: {said}")
    return None
