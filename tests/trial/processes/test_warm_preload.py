"""A warm-forked trial imports nothing on its way to the first step that its server could have imported.

Every module a forked child imports is read from disk (and, under PYTHONDONTWRITEBYTECODE, compiled) by
every trial, inside its startup_s. The server imports DEFAULT_PRELOAD plus its pipeline's preload list
once, before any trial exists; this test runs the worker's real path, up to where its clock stops
(the warm-up), in a process that imported exactly that, and lists what it still had to import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.side_by_side]

# What a search's warm server has imported when it forks (warm_server.serve), then each config's trial
# in turn, stopped at its warm-up, and every module that appeared since the preload.
_CHILD = r"""
import importlib, json, sys
from pathlib import Path

import autotune.trial.processes.warm_server  # the server's own module, and the child's code (warm_child)
from autotune import pipelines
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD

for name in (*DEFAULT_PRELOAD, *pipelines.preload_modules("unet")):
    importlib.import_module(name)
before = set(sys.modules)

from autotune.trial.loop import worker


class FirstStep(BaseException):  # past the worker's `except Exception`: the trial stops here
    pass


def first_step(*args, **kwargs):
    raise FirstStep


worker._warm_up = first_step
for config in sys.argv[1:]:
    try:
        worker.main(["--config", config, "--out", str(Path(config).with_name("result.json"))])
    except FirstStep:
        continue
    raise SystemExit(f"{config}: the trial ended before its warm-up: " + Path(config).with_name("result.json").read_text())
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_forked_unet_trial_imports_nothing_before_its_first_step(tiny_data: Path, tmp_path: Path) -> None:
    base = TrialConfig(pipeline="unet", data_dir=str(tiny_data), image_size=32, batch_size=2)
    # The baseline, and the knobs whose code paths import on their own (workers, bf16, fused, layout).
    configs = {
        "baseline": base,
        "tuned": base.replace(
            num_workers=2,
            persistent_workers=True,
            prefetch_factor=2,
            precision="bf16",
            optimizer_fusion="fused",
            channels_last=True,
            checkpoint_segments=2,
        ),
    }
    paths = []
    for name, cfg in configs.items():
        (tmp_path / name).mkdir()
        path = tmp_path / name / "config.json"
        path.write_text(json.dumps(cfg.to_dict()))
        paths.append(str(path))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *paths],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert imported == [], (
        f"imported in every forked trial, inside its startup_s: {imported}; "
        "add them to autotune.trial.processes.warm_client.DEFAULT_PRELOAD (or the pipeline's preload list)"
    )
