"""What the script-pipeline tests share: the README example, the test scripts, tiny images on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "tests" / "external_pipeline" / "plain_script.py"
SCRIPTS = Path(__file__).parent / "scripts"
# One compute thread: on a small shared machine two threads run a step many times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """autotune make-data's format: DIR/images/*.jpg and DIR/masks/*.png, 64 px (the script reads them at 32)."""
    from autotune.pipelines.unet.data import make_data

    return make_data(tmp_path_factory.mktemp("data") / "set", 16, (64, 64))
