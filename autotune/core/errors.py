"""Every failure autotune can name, and the one exit-code table. The CLI turns `AutotuneError` into exit code 2."""

from __future__ import annotations

import enum

from autotune.core.outcomes import Reason


class AutotuneError(Exception):
    """Bad input or configuration: reported as one line, exit code 2."""


class ConfigError(AutotuneError):
    """A TrialConfig or settings value that cannot be run."""


class SearchSpaceError(AutotuneError):
    """A search-space YAML file that is malformed or inconsistent."""


class DataError(AutotuneError):
    """A dataset folder that is missing, empty or inconsistent."""


class PipelineError(AutotuneError):
    """A --pipeline factory that cannot be imported or returns the wrong thing."""


class StorageError(AutotuneError):
    """A storage URL or file that is not a usable Optuna study store."""


class TrialFailure(Exception):
    """A trial that ran and failed. Not bad input: the search records it and goes on."""

    reason: str = Reason.ERROR

    def __init__(self, message: str, log_tail: str = "", partial: dict | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.partial = partial or {}


class TrialOOM(TrialFailure):
    reason: str = Reason.OOM


class TrialNumerics(TrialFailure):
    reason: str = Reason.NUMERICS


class TrialUnsupported(TrialFailure):
    reason: str = Reason.UNSUPPORTED


class TrialTimeout(TrialFailure):
    reason: str = Reason.TIMEOUT


class TrialCrashed(TrialFailure):
    reason: str = Reason.CRASH


class TrialCommFailure(TrialCrashed):
    """The ranks lost each other: NCCL's watchdog aborted a rank (SIGABRT, no verdict written) over a
    collective that timed out or failed. A crash still (exit code 1, not infeasible for the sampler),
    named apart, with the watchdog's own line as its message."""

    reason: str = Reason.COMM


class TrialBadConfig(TrialFailure):
    reason: str = Reason.BAD_CONFIG


class TrialDataError(TrialFailure):
    """A dataset item that could not be loaded: the data's fault, not the config's, so every config fails alike."""

    reason: str = Reason.DATA


class TrialPruned(TrialFailure):
    """Stopped early because it could not beat the best; its partial figures are kept."""

    reason: str = Reason.PRUNED


class DataItemError(Exception):
    """Raised by a pipeline's dataset for an item it cannot load, naming the file (`path`, relative to
    the data folder) or the item (`index`). The trial worker reports it as status "data", exit code 2.

    From a DataLoader worker process it reaches the trainer rebuilt from its message alone (torch's
    ExceptionWrapper puts the worker's traceback in front and drops the attributes): `summary` is the
    original one line either way."""

    def __init__(self, message: str, *, path: str | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.index = index

    @property
    def summary(self) -> str:
        text = str(self)
        marker = f"{type(self).__name__}: "
        if "Original Traceback" in text:
            # The traceback ends with the original "<module>.DataItemError: <message>" line(s).
            raised = [line for line in text.splitlines() if marker in line]
            if raised:
                return raised[-1].split(marker, 1)[1].strip()
        return text.strip().splitlines()[0] if text.strip() else type(self).__name__


class ExitCode(enum.IntEnum):
    """The one exit-code table: the same code for the same cause in every command and worker."""

    OK = 0
    ERROR = 1  # unexpected: a traceback in the log
    BAD_INPUT = 2  # one line, no traceback, nothing written
    OOM = 3
    NUMERICS = 4
    UNSUPPORTED = 5
    INTERRUPTED = 130


# A trial failure's reason <-> the exit code its worker process ends with. Two reasons share
# BAD_INPUT; an exit code without a result file reads back as the first of them, "bad_config".
_CODE_BY_REASON = {
    "bad_config": ExitCode.BAD_INPUT,
    "oom": ExitCode.OOM,
    "numerics": ExitCode.NUMERICS,
    "unsupported": ExitCode.UNSUPPORTED,
    "data": ExitCode.BAD_INPUT,
}
_FAILURES: dict[str, type[TrialFailure]] = {
    c.reason: c
    for c in (
        TrialOOM,
        TrialNumerics,
        TrialUnsupported,
        TrialTimeout,
        TrialCrashed,
        TrialBadConfig,
        TrialDataError,
        TrialPruned,
        TrialCommFailure,
    )
}


def exit_code_for(reason: str) -> ExitCode:
    """The exit code a worker (or `autotune trial`) ends with for a failure of this reason."""
    return _CODE_BY_REASON.get(reason, ExitCode.ERROR)


def reason_for_exit(code: int) -> str:
    """Read back a worker's exit code that came with no result file."""
    return next((r for r, c in _CODE_BY_REASON.items() if c == code), "error")


def failure_class(reason: str) -> type[TrialFailure]:
    """The TrialFailure for a worker's reported status ("error" and unknown ones are crashes)."""
    return _FAILURES.get(reason, TrialCrashed)
