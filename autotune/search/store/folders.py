"""Where a study's runs put their files: studies/<study>/<kind>/<this process's run>.

Class checks during the search, the parity gate and confirmation each launch trials of their own; this
process's run of them gets its own folder, so two searches that end one study at the same moment never
launch trials into the same folder (and read each other's result).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import optuna

from autotune.core.settings import SearchSettings

END_RUN = f"{time.strftime('%Y%m%d-%H%M%S')}-{socket.gethostname()}-{os.getpid()}"


def end_folder(settings: SearchSettings, study: optuna.Study, kind: str) -> Path:
    """studies/<study>/<kind>/<this process's run>: where confirmation ("confirm") or parity ("parity")
    trials of this run go."""
    return Path(settings.studies_dir) / study.study_name / kind / END_RUN


def trial_dir(settings: SearchSettings, number: int) -> Path:
    """Where trial `number` of the session's study runs and leaves its config, result and log."""
    return Path(settings.studies_dir) / settings.study / f"trial-{number}"
