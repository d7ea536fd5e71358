"""A pipeline module that leaves a file behind when it is imported (at the path in
AUTOTUNE_TEST_IMPORTED): tests/cli/test_worker_pipeline.py names it in a study as another writer would,
and the file's absence proves that a worker imported nothing of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

if os.environ.get("AUTOTUNE_TEST_IMPORTED"):
    Path(os.environ["AUTOTUNE_TEST_IMPORTED"]).touch()


def make(cfg: Any) -> None:
    # Not a Pipeline: were the module imported, the worker would stop at once rather than run trials.
    return None
