"""apply/alone.py: the export applied to a copy of the script, the way the diff would apply it: only at
the sites the exported trial recorded, the user's file untouched, a baseline config copied byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.apply.alone import patched_copy
from autotune.core.config import TrialConfig
from autotune.pipelines import script

TRAIN = """from torch.utils.data import DataLoader

train = DataLoader([1, 2, 3], batch_size=1, num_workers=0)
val = DataLoader([1, 2, 3], batch_size=1, num_workers=0)
"""
KNOBS = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}


def _site(path: Path, line: int, iterated: bool) -> dict[str, Any]:
    ran = KNOBS | ({"num_workers": 2, "prefetch_factor": 2} if iterated else {})
    return {"file": str(path), "line": line, "type": "DataLoader", "own": KNOBS, "ran": ran, "iterated": iterated}


def test_the_copy_is_patched_only_at_the_recorded_sites(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    cfg = TrialConfig(pipeline=script.spec_of(str(path), ["--epochs", "1"]), num_workers=2, prefetch_factor=2)
    sites = {"loaders": [_site(path, 3, True), _site(path, 4, False)], "optimizers": []}
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", sites)
    lines = patched.copy.read_text().splitlines()
    assert lines[2] == "train = DataLoader([1, 2, 3], batch_size=1, num_workers=2)"  # 2: torch's own prefetch
    assert lines[3] == "val = DataLoader([1, 2, 3], batch_size=1, num_workers=0)"  # never iterated: as written
    assert path.read_text() == TRAIN and patched.original == path and patched.args == ("--epochs", "1")
    # Without sites (a study made before they were recorded) every loader is edited, and it is said.
    every = patched_copy(cfg, tmp_path / "every", "cpu", None)
    assert every.copy.read_text().count("num_workers=2") == 2 and "recorded no DataLoader" in every.notes[0]


def test_a_baseline_config_is_the_script_as_written(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    patched = patched_copy(TrialConfig(pipeline=script.spec_of(str(path), [])), tmp_path / "alone", "cpu", None)
    assert patched.copy.read_bytes() == path.read_bytes() and patched.notes == ()
