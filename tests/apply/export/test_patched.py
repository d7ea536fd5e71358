"""apply/export/patched.py: the export applied to a copy of the script, the way the diff would apply it: only at
the sites the exported trial recorded, the user's file untouched, a baseline config copied byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from autotune.apply.export.patched import patched_copy
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


MODEL = """import torch


def build(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3)
"""


def test_a_module_the_diff_edits_is_copied_beside_the_script(tmp_path: Path) -> None:
    """The optimizer is built in model.py: the copy's folder holds model.py with the measured flag, and the
    user's model.py is untouched."""
    path = tmp_path / "train.py"
    path.write_text("import torch\nfrom model import build\n\nopt = build(torch.nn.Linear(2, 2))\n")
    (tmp_path / "model.py").write_text(MODEL)
    own = {"fused": None, "foreach": None}
    site = {"file": str(tmp_path / "model.py"), "line": 5, "type": "AdamW", "own": own, "ran": "fused", "stepped": True}
    cfg = TrialConfig(pipeline=script.spec_of(str(path), []), optimizer_fusion="fused")
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", {"loaders": [], "optimizers": [site]})
    assert patched.modules == (tmp_path / "alone" / "model.py",)
    assert "lr=1e-3, fused=True)" in patched.modules[0].read_text() and (tmp_path / "model.py").read_text() == MODEL
    assert patched.copy.read_text() == path.read_text()  # the script itself has nothing to change


def test_a_package_the_diff_edits_is_copied_whole(tmp_path: Path) -> None:
    """pkg/model.py edited: the copy holds all of pkg (found first on sys.path, it is the pkg imported)."""
    path = tmp_path / "train.py"
    path.write_text("import torch\nfrom pkg.model import build\n\nopt = build(torch.nn.Linear(2, 2))\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg import other\n")
    (tmp_path / "pkg" / "other.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "model.py").write_text(MODEL)
    own = {"fused": None, "foreach": None}
    site = {"file": str(tmp_path / "pkg" / "model.py"), "line": 5, "type": "AdamW", "own": own, "ran": "fused"}
    cfg = TrialConfig(pipeline=script.spec_of(str(path), []), optimizer_fusion="fused")
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", {"loaders": [], "optimizers": [site | {"stepped": True}]})
    copied = sorted(p.relative_to(tmp_path / "alone").as_posix() for p in (tmp_path / "alone").rglob("*.py"))
    assert copied == ["pkg/__init__.py", "pkg/model.py", "pkg/other.py", "train.py"]
    assert patched.modules == (tmp_path / "alone" / "pkg" / "model.py",)
    assert "fused=True" in (tmp_path / "alone" / "pkg" / "model.py").read_text()
    assert (tmp_path / "pkg" / "model.py").read_text() == MODEL


ARGPARSE = """import argparse

from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("-j", "--workers", type=int, default=4)
args = parser.parse_args()
train = DataLoader([1, 2, 3], batch_size=1, num_workers=args.workers, pin_memory=True)
"""


def test_the_copy_runs_as_the_export_tells_the_user_to_run_it(tmp_path: Path) -> None:
    """Seen on a public classifier: the study ran `-j 2`, the export said "run it with --workers 0", and the
    alone rounds ran the copy with `-j 2` (x1.09; x1.23 as told). The copy also set pin_memory=False on a
    CPU, which the diff does not write. The copy holds exactly the diff, and runs with the flag as advised."""
    from autotune.apply.export.diff import to_diff
    from autotune.core.configfile import Export

    path = tmp_path / "train.py"
    path.write_text(ARGPARSE)
    cfg = TrialConfig(pipeline=script.spec_of(str(path), ["-j", "2", "--epochs=1"]), set_to_none=False)
    own = {"num_workers": 2, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": False}
    ran = own | {"num_workers": 0, "prefetch_factor": None}
    sites = {
        "loaders": [{"file": str(path), "line": 8, "type": "DataLoader", "own": own, "ran": ran, "iterated": True}]
    }
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", sites)
    assert patched.args == ("-j", "2", "--epochs=1") and patched.copy_args == ("-j", "0", "--epochs=1")
    assert any("run it with --workers 0" in note for note in patched.notes), patched.notes
    diff = to_diff(Export(cfg, sites=sites), device="cpu", cwd=str(tmp_path))
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert any("default=0" in line for line in added) and not any("pin_memory=False" in line for line in added)
    copy = patched.copy.read_text()  # exactly the diff: pinning, a no-op on a CPU, is not written there either
    assert "default=0" in copy and "pin_memory=True" in copy and "pin_memory=False" not in copy


UNEDITED = Path(__file__).parents[2] / "trial" / "loop" / "script" / "scripts" / "unedited" / "train.py"


def test_the_model_knobs_no_diff_writes_are_applied_in_the_copys_runs(tmp_path: Path, monkeypatch: Any) -> None:
    """An unedited script's precision, channels_last and checkpointing reach its model through the trial's
    seams; no line names that model for sure, so the diff says so, and the alone runs of the patched copy
    apply them as `autotune run` does (else the last word would measure a copy without them)."""
    from autotune.apply.export.diff import to_diff
    from autotune.core.configfile import Export
    from autotune.trial.probes.alone import measure

    path = Path(shutil.copy(UNEDITED, tmp_path / "train.py"))
    cfg = TrialConfig(pipeline=script.spec_of(str(path), ["--steps", "12"]), precision="bf16", checkpoint_segments=2)
    diff = to_diff(Export(cfg, sites={"loaders": [], "optimizers": []}), device="cpu", cwd=str(tmp_path))
    assert "# not in the diff: checkpoint_segments 2: " in diff and "# not in the diff: precision bf16: " in diff
    assert "`autotune run --config best.yaml SCRIPT ARGS` applies it" in diff
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", {"loaders": [], "optimizers": []})
    assert patched.model is not None and patched.model.is_file()
    monkeypatch.chdir(tmp_path)
    got = measure(patched.copy, list(patched.copy_args), 1, 4, model=patched.model)
    assert got["model"]["precision"]["in_effect"] == "bf16"
    assert got["model"]["checkpoint_segments"]["in_effect"] == ["blocks.0", "blocks.1"]


def test_the_alone_copy_applies_each_model_knob_once_where_the_diff_writes_it(tmp_path: Path, monkeypatch: Any) -> None:
    """Where the diff names the model (the stepped optimizer built from `model.parameters()`), it writes the model
    knobs as torch lines; the copy's alone runs must not apply them again through the seams: each block is
    checkpointed once (the calls to torch's composable checkpoint counted), and each forward of the model enters
    one bf16 autocast."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    from autotune.apply.export.diff import to_diff
    from autotune.core.configfile import Export
    from autotune.trial.loop import worker
    from autotune.trial.probes.alone import measure

    path = Path(shutil.copy(UNEDITED, tmp_path / "train.py"))
    spec = script.spec_of(str(path), ["--steps", "12"])
    cfg = TrialConfig(pipeline=spec, precision="bf16", checkpoint_segments=2, warmup_steps=1, timed_steps=3, window=1)
    monkeypatch.chdir(tmp_path)
    sites = worker.run(cfg).applied["script"]["sites"]
    diff = to_diff(Export(cfg, sites=sites), device="cpu", cwd=str(tmp_path))
    assert "checkpoint(" in diff and "torch.autocast" in diff, diff  # the diff wrote both
    patched = patched_copy(cfg, tmp_path / "alone", "cpu", sites)
    assert patched.model is None  # nothing left for the seams to apply
    entered: list[Any] = []
    inside: list[int] = []  # the autocast entries made while each forward of the model ran (not backward's)
    enter = torch.amp.autocast_mode.autocast.__enter__

    def counting(self: Any) -> Any:
        entered.append(self.fast_dtype)
        return enter(self)

    def pre(module: Any, args: Any) -> None:
        if type(module).__name__ == "Net":
            inside.append(-len(entered))

    def post(module: Any, args: Any, output: Any) -> None:
        if type(module).__name__ == "Net":
            inside[-1] += len(entered)

    monkeypatch.setattr(torch.amp.autocast_mode.autocast, "__enter__", counting)
    composable = torch.distributed._composable
    checkpointed: list[str] = []  # each block torch's composable checkpoint was applied to, the diff's or the seams'
    checkpoint = composable.checkpoint

    def counting_checkpoint(module: Any, *args: Any, **kwargs: Any) -> Any:
        checkpointed.append(type(module).__name__)
        return checkpoint(module, *args, **kwargs)

    monkeypatch.setattr(composable, "checkpoint", counting_checkpoint)
    hooks = [register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True)]
    try:
        measure(patched.copy, list(patched.copy_args), 1, 4, model=patched.model)
    finally:
        for hook in hooks:
            hook.remove()
    assert inside and set(inside) == {1}, inside  # one autocast per forward: the diff's, not the seams' too
    assert len(checkpointed) == 2, checkpointed  # checkpoint_segments 2: two blocks, each checkpointed once
