"""The search's one budget: what each phase may spend, read off one clock.

`--budget` is the wall time of one run of a search. Part of it is kept up front for the end of the
search (confirmation and the parity gate); the trial loop spends the rest. Every phase asks one frozen
`Budget`, made when the run starts, and none keeps a clock of its own:

* the trial loop runs until `search_deadline` (the budget less the reserves, counted from when the loop
  begins: the warm server's start-up comes out of the end's share); the reserves together are at most
  half the budget, the alone rounds' kept whole and the others cut in proportion where they would be
  more (`Budget.of`),
  each trial's timeout cut to what is left plus the grace;
* a class check during the search starts only if it ends by `search_deadline`;
* confirmation runs whole rounds that end by `confirm_end` (the end, less the alone rounds' share);
* the parity gate and the extension rounds may run to `checks_end`: the late end less the ceiling's
  and the alone rounds' shares, so both still run after them;
* the ceiling may run to `ceiling_end`: the late end less the alone rounds' share;
* a script study's last word, the script as written against the export applied, each run alone in
  paired rounds (search/loop/alone.py), may run to `late_end`: the search promises to end within
  budget + max(30 s, 2%), and 10 s of that stay for the export;
* the live display shows `left_s()`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from collections.abc import Sequence

from autotune.core.config import TrialConfig
from autotune.core.paired import MIN_ROUNDS
from autotune.core.settings import SearchSettings
from autotune.pipelines import kind_of
from autotune.trial.probes.ceiling import why_not

# A trial's measured seconds when the workload counts steps instead (seconds=None): a first guess.
GUESSED_TRIAL_S = 15.0
# A confirmation trial's start-up and warm-up beside its measured seconds (a forked start, ~5-10 s).
CONFIRM_OVERHEAD_S = 10.0
# A parity run's start-up beside its K steps, which take about a trial's measured seconds.
PARITY_OVERHEAD_S = 15.0
# The ceiling's fresh process: a cold start of the pipeline (the Unet's ~8 s on a 2-core CPU) and about
# 10 s of alternated steps and the matmul probe (search/loop/export_ceiling.need_s for a measured step time).
CEILING_S = 20.0
# One alone run of a user's script (search/loop/alone.py): a fresh `python` (torch imported cold, the
# script's own set-up and warm-up steps) and about ALONE_TIMED_S of timed steps; two runs a round.
ALONE_OVERHEAD_S = 10.0
# 15 s, not fewer: a run's speed swings with its first seconds (loader workers filling their queues, the
# allocator, the VM's placement); 5 s runs missed an x1.25 a 60-step paired measurement found (mnist).
ALONE_TIMED_S = 15.0


def trial_seconds(base: TrialConfig) -> float:
    """About how long one trial measures: the workload's time box, else a first guess."""
    return base.seconds or GUESSED_TRIAL_S


def grace_s(budget_s: float | None) -> float:
    """How far past the budget the end of a search (the last trial, confirmation, the parity gate) may
    run: the search promises to end within budget + max(30 s, 2%), and 10 s of that stay for the export."""
    return max(30.0, 0.02 * (budget_s or 0)) - 10.0


def confirm_rounds(settings: SearchSettings) -> int:
    """The confirmation's rounds: --confirm-rounds, and never fewer than MIN_ROUNDS (fewer cannot show a
    gain, and no export changes anything without one); 0: off."""
    return max(settings.confirm_rounds, MIN_ROUNDS) if settings.confirm_rounds else 0


def confirm_trial_s(settings: SearchSettings, measured_s: float | None = None) -> float:
    """A confirmation trial's seconds: `measured_s`, a trial's launch-to-result time once one is measured
    (trial 0's: a confirmation trial is the same fresh process); before that its time box and a fresh
    process's start-up (planned without the start-up, '3 more rounds' fitted 2)."""
    return measured_s if measured_s else trial_seconds(settings.base) + CONFIRM_OVERHEAD_S


def confirm_reserve_s(settings: SearchSettings) -> float:
    """What confirmation keeps: (top + baseline) x rounds trials of measured seconds plus start-up, at
    most half the budget (the search needs trials to have something to confirm)."""
    if settings.confirm_rounds == 0 or settings.budget_s is None:
        return 0.0
    return min((settings.confirm_top + 1) * confirm_rounds(settings) * confirm_trial_s(settings), settings.budget_s / 2)


def least_confirming_budget_s(
    settings: SearchSettings, trial_s: float | None = None, *, alone_kept: bool = False
) -> float | None:
    """The shortest budget, in whole minutes, whose end share pays for MIN_ROUNDS rounds of one config
    beside the baseline (rounds that need it take the alone rounds' share: confirm.deadline): below it
    nothing but the baseline can be exported, whatever the trials find. `alone_kept`: rounds that leave a
    script study's alone rounds their share, so both run. `trial_s`: a confirmation trial's measured seconds
    (confirm_trial_s). None: confirmation is off, or no budget up to a day pays for it."""
    if settings.confirm_rounds == 0:
        return None
    need = 2 * MIN_ROUNDS * confirm_trial_s(settings, trial_s)
    for minutes in range(1, 24 * 60 + 1):
        b = Budget.of(dataclasses.replace(settings, budget_s=60.0 * minutes), 0.0)
        if b.reserve_s + (0.0 if alone_kept else b.alone_reserve_s) >= need:
            return 60.0 * minutes
    return None


def parity_reserve_s(settings: SearchSettings) -> float:
    """What the parity gate keeps: the reference (2 runs) and one candidate, each about a trial's length
    (K steps of the baseline and start-up), at most a quarter of the budget."""
    if not settings.parity_steps or settings.budget_s is None:
        return 0.0
    return min(3 * (trial_seconds(settings.base) + PARITY_OVERHEAD_S), settings.budget_s / 4)


def ceiling_reserve_s(settings: SearchSettings) -> float:
    """What the export's ceiling keeps: a first guess at its one process, at most a tenth of the budget;
    nothing when it is not measured (turned off, or a job that trains in its own loop)."""
    if settings.budget_s is None or why_not(settings.base) is not None:
        return 0.0
    return min(CEILING_S, settings.budget_s / 10)


def alone_reserve_s(settings: SearchSettings) -> float:
    """What a script study's alone rounds keep: MIN_ROUNDS rounds of two fresh runs (the script as written
    and the export applied), at most a quarter of the budget; nothing for another kind of job."""
    if settings.budget_s is None or not kind_of(settings.base.pipeline).runs_alone:
        return 0.0
    return min(MIN_ROUNDS * 2 * (ALONE_OVERHEAD_S + ALONE_TIMED_S), settings.budget_s / 4)


@dataclass(frozen=True)
class Budget:
    """One run's budget: its start on time.monotonic()'s clock, and every deadline derived from it."""

    started: float  # time.monotonic() when the run began
    budget_s: float | None  # None: no time limit (a worker bounded by --n-trials)
    trial_timeout_s: float
    grace_s: float
    confirm_reserve_s: float
    parity_reserve_s: float
    ceiling_reserve_s: float = 0.0  # 0: no ceiling measured at the end
    alone_reserve_s: float = 0.0  # 0: no alone rounds at the end (not a script study)
    # When the trial loop began: its share is counted from there, so the warm server's start-up comes out
    # of the end's share, not the trials'. None: from `started`.
    trials_started: float | None = None

    @classmethod
    def of(cls, settings: SearchSettings, started: float | None = None) -> Budget:
        """The budget of a run of `settings` that starts now (or at `started`). The end's shares together
        are at most half the budget: the trials keep the other half, and every phase its own share of the
        whole, so none runs on another's time. A script study's alone rounds keep theirs whole (at most a
        quarter): they are its last word, and cut short they cannot tell a gain from a process's own
        swing; the others are cut in proportion to what is left of the half."""
        alone = alone_reserve_s(settings)
        shares = {
            "confirm_reserve_s": confirm_reserve_s(settings),
            "parity_reserve_s": parity_reserve_s(settings),
            "ceiling_reserve_s": ceiling_reserve_s(settings),
        }
        total = sum(shares.values())
        if settings.budget_s is not None and total + alone > settings.budget_s / 2:
            shares = {k: v * (settings.budget_s / 2 - alone) / total for k, v in shares.items()}
        return cls(
            started=time.monotonic() if started is None else started,
            budget_s=settings.budget_s,
            trial_timeout_s=settings.trial_timeout,
            grace_s=grace_s(settings.budget_s),
            alone_reserve_s=alone,
            **shares,
        )

    @property
    def reserve_s(self) -> float:
        """Kept from the trial loop for the end of the search (confirmation, the parity gate, the ceiling)."""
        return self.confirm_reserve_s + self.parity_reserve_s + self.ceiling_reserve_s

    @property
    def end(self) -> float | None:
        """The budget's end: confirmation's rounds must end by it."""
        return None if self.budget_s is None else self.started + self.budget_s

    @property
    def confirm_end(self) -> float | None:
        """The end less the alone rounds' share: confirmation's rounds must end by it."""
        return None if self.end is None else self.end - self.alone_reserve_s

    @property
    def late_end(self) -> float | None:
        """The end plus the grace: the alone rounds, last of all, must end by it."""
        return None if self.end is None else self.end + self.grace_s

    @property
    def ceiling_end(self) -> float | None:
        """The late end less the alone rounds' share: the ceiling ends by it."""
        return None if self.late_end is None else self.late_end - self.alone_reserve_s

    @property
    def checks_end(self) -> float | None:
        """The ceiling's end less its share: the parity gate and the extension rounds end by it."""
        return None if self.ceiling_end is None else self.ceiling_end - self.ceiling_reserve_s

    @property
    def search_deadline(self) -> float | None:
        """When the trial loop stops: the budget less the reserves (the end's, and the alone rounds'), and
        at least half the budget, counted from when the trial loop began."""
        if self.budget_s is None:
            return None
        start = self.started if self.trials_started is None else self.trials_started
        return start + max(self.budget_s - self.reserve_s - self.alone_reserve_s, self.budget_s / 2)

    def trials_begin(self, now: float | None = None) -> Budget:
        """This budget with the trial loop beginning now (the warm server is up)."""
        return dataclasses.replace(self, trials_started=_now(now))

    # ---- what a phase asks --------------------------------------------------------------------------

    def search_left(self, now: float | None = None) -> float:
        """Seconds left to the trial loop (inf without a budget)."""
        deadline = self.search_deadline
        return float("inf") if deadline is None else deadline - _now(now)

    def trials_over(self, left: float, durations: Sequence[float]) -> bool:
        """Whether the trial loop ends with `left` seconds left: none left, or the median trial so far
        would overrun them by more than the grace."""
        return left <= 0 or bool(durations and statistics.median(durations) > left + self.grace_s)

    def trial_timeout(self, left: float) -> float:
        """A trial's timeout with `left` seconds left to the trial loop: never past them plus the grace."""
        return min(self.trial_timeout_s, left + self.grace_s)

    @staticmethod
    def fits(need_s: float, deadline: float | None, now: float | None = None) -> bool:
        """Whether `need_s` seconds started now end by `deadline` (one of the properties above; None: always)."""
        return deadline is None or _now(now) + need_s <= deadline

    def left_s(self, now: float | None = None) -> float | None:
        """Seconds to the budget's end, never below 0; None without a budget (the live display's clock)."""
        return None if self.end is None else max(0.0, self.end - _now(now))


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now
