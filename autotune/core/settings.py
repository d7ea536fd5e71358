"""What `autotune search` (or `worker`) was asked to do, and the parsing of its flags' values (durations,
percentages): validated before any study is touched."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError

SAMPLERS = ("auto", "tpe", "gp", "random")
DEFAULT_TRIAL_TIMEOUT_S = 600.0  # with no budget to derive it from


@dataclass(frozen=True)
class SearchSettings:
    """What `autotune search` (or `worker`) was asked to do; validated before any study is touched."""

    budget_s: float | None = None  # None: no time limit (a worker bounded by n_trials, or --create-only)
    study: str = "autotune"
    storage: str | None = None  # None = JournalFile `studies.db` in the working directory
    space: str | None = None  # None: the default space shipped with autotune
    sampler: str = "auto"  # auto: a coordinate pass interleaved with TPE; tpe|gp|random: plain Optuna
    seed: int | None = None
    trial_timeout_s: float | None = None  # None = derived from the budget
    n_trials: int | None = None
    force: bool = False
    studies_dir: str = "studies"
    base: TrialConfig = field(default_factory=TrialConfig)  # the workload every trial shares
    skip_bad_data: bool = False  # drop undecodable data items (and say how many) instead of refusing
    confirm_top: int = 3  # distinct top configs re-measured against the baseline before the export
    confirm_rounds: int = 3  # interleaved rounds of that; 0 turns confirmation off
    parity_steps: int = 30  # optimizer steps the winner and the baseline train side by side; 0: no check
    memory_headroom: float = 0.10  # a config must leave this fraction of device memory (RAM on CPU) free

    def __post_init__(self) -> None:
        if self.budget_s is not None and not (
            isinstance(self.budget_s, (int, float)) and math.isfinite(self.budget_s) and self.budget_s > 0
        ):
            raise ConfigError(f"--budget must be positive, got {self.budget_s!r}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"--sampler must be one of {'|'.join(SAMPLERS)}, got {self.sampler!r}")
        if self.trial_timeout_s is not None and self.trial_timeout_s <= 0:
            raise ConfigError(f"--trial-timeout must be positive, got {self.trial_timeout_s!r}")
        if self.n_trials is not None and self.n_trials < 1:
            raise ConfigError(f"--n-trials must be >= 1, got {self.n_trials!r}")
        if self.confirm_rounds < 0 or self.confirm_top < 1:
            raise ConfigError(
                f"--confirm-rounds must be >= 0 and --confirm-top >= 1, got "
                f"{self.confirm_rounds} and {self.confirm_top}"
            )
        if self.parity_steps < 0:
            raise ConfigError(f"--parity-steps must be >= 0, got {self.parity_steps}")
        if not (isinstance(self.memory_headroom, (int, float)) and 0 <= self.memory_headroom < 0.9):
            raise ConfigError(f"--memory-headroom must be in [0%, 90%), got {self.memory_headroom!r}")
        if not self.study or "/" in self.study:
            raise ConfigError(f"--study must be a plain name, got {self.study!r}")

    @property
    def trial_timeout(self) -> float:
        # A trial that needs more than a quarter of the budget can't be compared with others anyway.
        if self.trial_timeout_s:
            return self.trial_timeout_s
        return max(120.0, self.budget_s / 4) if self.budget_s else DEFAULT_TRIAL_TIMEOUT_S


def parse_duration(text: str, flag: str = "--budget") -> float:
    """'2h', '90m', '1h30m', '45s' or plain seconds -> seconds."""
    import re

    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", s)
        if not s or not m or not any(m.groups()):
            raise ConfigError(f"{flag} {text!r}: use e.g. 2h, 90m, 1h30m, 45s or plain seconds")
        h, mi, se = (float(g or 0) for g in m.groups())
        value = h * 3600 + mi * 60 + se
    if value <= 0:
        raise ConfigError(f"{flag} {text!r}: must be more than zero")
    return value


def parse_percent(text: str, flag: str) -> float:
    """'10%' or a fraction ('0.1') -> 0.1."""
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: use a percentage such as 10% (or a fraction such as 0.1)") from None
    if not math.isfinite(value):
        raise ConfigError(f"{flag} {text!r}: must be a finite percentage")
    return value
