"""The baseline of a script trial: the script as written, its own settings, nothing overridden.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from autotune.core.config import TrialConfig, baseline_of

AS_WRITTEN = "the baseline runs the script's own settings"


def is_as_written(cfg: TrialConfig) -> bool:
    """The baseline's knobs: run the script as it is, overriding nothing."""
    return cfg.knobs() == baseline_of(cfg).knobs()
