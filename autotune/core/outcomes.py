"""One vocabulary for outcomes: a trial's role, the reason it failed or was not run, what became of it, and a
check's verdict.

Each is a string enum whose values are the words studies have always stored, so a stored study stays
readable and a member compares equal to its word (`Role.BASELINE == "baseline"`). Every module names
these through the enums, never as literals (tests/core/test_outcomes.py holds it). A member prints,
formats and serialises (JSON, YAML) as its word.
"""

from __future__ import annotations

import enum

import yaml


class _Word(str, enum.Enum):
    """A stored word: equal to its string, printed and formatted as it."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Role(_Word):
    """Why a trial was run."""

    BASELINE = "baseline"  # trial 0: the user's own config, the reference for every speedup
    WARM_START = "warm_start"  # trial 1: the published guides' config, resolved against the hardware
    SEARCH = "search"  # proposed by the sampler (or the coordinate pass)


class Reason(_Word):
    """Why a trial failed, or was told infeasible without running (core/errors.py's failures use these)."""

    ERROR = "error"
    OOM = "oom"
    NUMERICS = "numerics"
    UNSUPPORTED = "unsupported"
    TIMEOUT = "timeout"
    CRASH = "crash"
    COMM = "comm"
    BAD_CONFIG = "bad_config"
    DATA = "data"
    PRUNED = "pruned"
    COMPILE_TIMEOUT = "compile_timeout"  # still compiling when its timeout came: infeasible
    INTERRUPTED = "interrupted"  # the search was stopped while it ran
    BUDGET = "budget"  # the search's budget ended while it ran
    STALE = "stale"  # its controller died; another process failed it
    DISK = "disk"  # the disk refused a write
    HEADROOM = "headroom"  # its peak memory left less than the headroom free
    MEMORY_ESTIMATE = "memory_estimate"  # not run: its estimate breaks the headroom
    CLASS_FAILED = "class_failed"  # not run: its training math failed its check
    COST_ESTIMATE = "cost_estimate"  # not run: its estimated wall time exceeds what its trial would be given


# The reasons a trial is told infeasible without running: its figures are estimates, or its class failed.
NOT_RUN = frozenset({Reason.MEMORY_ESTIMATE, Reason.CLASS_FAILED, Reason.COST_ESTIMATE})


class Outcome(_Word):
    """What became of a trial: derived from its state, constraints, reason and reuse in one place
    (search/store/records.outcome), never stored, so every reader (the leaderboard, the live display, the
    report, the strategy, the checks summary) sees the same answer."""

    MEASURED = "measured"  # a clean figure: it ranks
    CONTENDED = "contended"  # measured while another process shared its CPUs: ranks below every clean figure
    REUSED = "reused"  # the same config as an earlier trial: that figure reused, nothing run
    INFEASIBLE = "infeasible"  # it ran and could not train (out of memory, non-finite, unsupported...)
    WRITTEN_OFF = "written_off"  # told infeasible without running (NOT_RUN's reasons)
    FAILED = "failed"  # the trial itself failed (a crash, a timeout, the search stopped while it ran)
    PRUNED = "pruned"
    PENDING = "pending"  # queued or running

    @property
    def ranks(self) -> bool:
        """Its figure is a measurement of its own that can be the best."""
        return self in (Outcome.MEASURED, Outcome.CONTENDED)

    @property
    def unsuccessful(self) -> bool:
        """It gave no figure: infeasible, written off or failed."""
        return self in (Outcome.INFEASIBLE, Outcome.WRITTEN_OFF, Outcome.FAILED)


class Verdict(_Word):
    """What a parity, time-to-target or class check said."""

    PASS = "pass"
    FAIL = "fail"
    NOT_CHECKED = "not checked"  # it did not fit in the budget, or the baseline could not train
    SKIPPED = "skipped"  # passed over: it trains differently and was not checked


def _represent(dumper: yaml.SafeDumper, word: _Word) -> yaml.Node:
    return dumper.represent_str(str(word.value))


yaml.SafeDumper.add_multi_representer(_Word, _represent)
