"""Every failure autotune can name. The CLI turns `AutotuneError` into exit code 2."""
from __future__ import annotations


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

    reason = "error"

    def __init__(self, message: str, log_tail: str = "", partial: dict | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.partial = partial or {}


class TrialOOM(TrialFailure):
    reason = "oom"


class TrialNumerics(TrialFailure):
    reason = "numerics"


class TrialUnsupported(TrialFailure):
    reason = "unsupported"


class TrialTimeout(TrialFailure):
    reason = "timeout"


class TrialCrashed(TrialFailure):
    reason = "crash"


class TrialBadConfig(TrialFailure):
    reason = "bad_config"


class TrialPruned(TrialFailure):
    """Stopped early because it could not beat the best; its partial figures are kept."""

    reason = "pruned"
