"""`export --format diff` holds exactly what was measured (issue 41): the loaders a trial iterated and the
optimizers it stepped, wherever the script built them (another module: a second file of the diff, or said
with the line to write); only knobs whose measured value differs from the script's own, never one that
does nothing on the machine measured; a value from an argparse option through the option's default, so
the script's own flag keeps working. Each diff is applied with GNU patch, as the user would."""

from __future__ import annotations

import ast
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.apply.export.diff import to_diff
from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.pipelines import script
from autotune.trial.loop import worker

needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")


def _export(path: Path, args: list[str] | None = None, sites: Any = None, **knobs: Any) -> Export:
    # A script with no at.batch_size() has its DataLoader's batch searched: a test of other knobs gives
    # the script's own batch_size, so the export changes only those.
    cfg = TrialConfig(pipeline=script.spec_of(str(path), args or []), **knobs)
    recorded = {} if sites is None else {"sites": sites}  # none: a study made before sites were recorded
    return Export(config=cfg, environment={"device": "cpu"}, speedup=1.25, **recorded)


def _apply(folder: Path, diff: str) -> None:
    (folder / "tuned.diff").write_text(diff)
    run = subprocess.run(["patch", "-p0", "-i", "tuned.diff"], cwd=folder, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _changed(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def _notes(diff: str) -> list[str]:
    return [line.removeprefix("# not in the diff: ") for line in diff.splitlines() if line.startswith("# not in")]


def _loader(path: Path, line: int, iterated: bool, own: dict[str, Any], ran: dict[str, Any]) -> dict[str, Any]:
    """A DataLoader site as a trial records it (trial/loop/script/sites.py)."""
    knobs = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}
    return {
        "file": str(path),
        "line": line,
        "type": "DataLoader",
        "own": knobs | own,
        "ran": knobs | ran,
        "iterated": iterated,
    }


def _optimizer(path: Path, line: int, ran: str, own: dict[str, Any] | None = None) -> dict[str, Any]:
    own = {"fused": None, "foreach": None} | (own or {})
    return {"file": str(path), "line": line, "type": "AdamW", "own": own, "ran": ran, "stepped": True}


# ------------------------------------------------------------------------------------------ loaders

_LOADERS = """import argparse
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("-j", "--workers", type=int, default=4)
args = parser.parse_args()
train = DataLoader([1, 2, 3], batch_size=1, num_workers=args.workers, pin_memory=True)
val = DataLoader([1, 2, 3], batch_size=1, num_workers=args.workers, pin_memory=True)
"""


@needs_patch
def test_a_validation_loader_no_trial_iterated_is_left_alone(tmp_path: Path) -> None:
    """The trial ends inside the first epoch: its validation loader is built, never iterated, and what its
    arguments were is nothing the search measured."""
    target = tmp_path / "train.py"
    target.write_text(_LOADERS.replace("num_workers=args.workers", "num_workers=4"))
    sites = {
        "loaders": [
            _loader(target, 7, True, {"num_workers": 4, "pin_memory": True}, {"num_workers": 2}),
            _loader(target, 8, False, {"num_workers": 4, "pin_memory": True}, {"num_workers": 2}),
        ],
        "optimizers": [],
    }
    diff = to_diff(_export(target, sites=sites, num_workers=2), device="cpu", cwd=str(tmp_path))
    assert _changed(diff) == [
        "-train = DataLoader([1, 2, 3], batch_size=1, num_workers=4, pin_memory=True)",
        "+train = DataLoader([1, 2, 3], batch_size=1, num_workers=2, pin_memory=True)",
    ]
    _apply(tmp_path, diff)
    assert "val = DataLoader([1, 2, 3], batch_size=1, num_workers=4, pin_memory=True)" in target.read_text()


def test_a_knob_fixed_as_a_no_op_here_is_never_written(tmp_path: Path) -> None:
    """Without CUDA the space fixes pin_memory to False (pinning is a no-op): every trial ran it so, over the
    script's own True, and measured nothing of it. Only the knob whose measured value differs is written."""
    target = tmp_path / "train.py"
    target.write_text(_LOADERS.replace("num_workers=args.workers", "num_workers=0"))
    diff = to_diff(_export(target, batch_size=1, num_workers=2), device="cpu", cwd=str(tmp_path))
    changed = _changed(diff)
    assert changed and all("pin_memory=True" in line for line in changed)
    assert "+train = DataLoader([1, 2, 3], batch_size=1, num_workers=2, pin_memory=True)" in changed
    # measured on a GPU, pinning is a measured value: written where it differs
    diff = to_diff(_export(target, batch_size=1, num_workers=2), device="NVIDIA H200", cwd=str(tmp_path))
    assert "+train = DataLoader([1, 2, 3], batch_size=1, num_workers=2, pin_memory=False)" in _changed(diff)


@needs_patch
def test_an_argparse_value_changes_the_option_s_default(tmp_path: Path) -> None:
    """num_workers=args.workers stays the user's argument: the option's default becomes the measured value,
    so `-j` still works; the study's own `-j` is said, since it overrides the default."""
    target = tmp_path / "train.py"
    target.write_text(_LOADERS)
    diff = to_diff(_export(target, batch_size=1, num_workers=2), device="cpu", cwd=str(tmp_path))
    assert _changed(diff) == [
        '-parser.add_argument("-j", "--workers", type=int, default=4)',
        '+parser.add_argument("-j", "--workers", type=int, default=2)',
    ]
    _apply(tmp_path, diff)
    assert target.read_text().count("num_workers=args.workers") == 2
    # a best that ran the option's own value changes nothing
    diff = to_diff(_export(target, batch_size=1, num_workers=2), device="cpu", cwd=str(tmp_path))
    assert "\n@@ " not in diff
    target.write_text(_LOADERS)
    diff = to_diff(_export(target, ["-j", "3"], batch_size=1, num_workers=2), device="cpu", cwd=str(tmp_path))
    assert "--workers: the study ran the script with -j, which overrides the default: run it with --workers 2" in (
        _notes(diff)
    )


# --------------------------------------------------------------------------------------- optimizers

_TRAIN = """import torch
from model import Net

model = Net()
optimizer = model.configure_optimizers(1e-3)
"""
_MODEL = """import torch


class Net(torch.nn.Linear):
    def __init__(self):
        super().__init__(2, 2)

    def configure_optimizers(self, lr, **extra_args):
        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1)
"""


@needs_patch
def test_an_optimizer_built_in_another_module_is_reached(tmp_path: Path) -> None:
    """nanoGPT builds its AdamW in model.py: a best of fused AdamW edits that module, a second file of the
    same diff, named relative to where it is applied."""
    (tmp_path / "train.py").write_text(_TRAIN)
    (tmp_path / "model.py").write_text(_MODEL)
    sites = {"loaders": [], "optimizers": [_optimizer(tmp_path / "model.py", 9, "fused")]}
    e = _export(tmp_path / "train.py", sites=sites, optimizer_fusion="fused")
    diff = to_diff(e, device="cpu", cwd=str(tmp_path))
    assert "--- model.py\n+++ model.py\n" in diff
    assert _changed(diff) == [
        "-        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1)",
        "+        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1, fused=True)",
    ]
    _apply(tmp_path, diff)
    assert "fused=True" in (tmp_path / "model.py").read_text()
    # a record that it already ran fused (its own flags) is no change
    sites["optimizers"] = [_optimizer(tmp_path / "model.py", 9, "fused", {"fused": True})]
    assert "\n@@ " not in to_diff(e, device="cpu", cwd=str(tmp_path))


def test_an_optimizer_the_diff_cannot_edit_is_named_with_the_line_to_write(tmp_path: Path) -> None:
    """Given one **mapping (which may hold the flag already), the flag is merged over it; given several,
    or in a file outside the folder the diff is applied from: the file, its line, and the line to write."""
    (tmp_path / "train.py").write_text(_TRAIN)
    (tmp_path / "model.py").write_text(_MODEL.replace("weight_decay=0.1)", "weight_decay=0.1, **extra_args)"))
    sites = {"loaders": [], "optimizers": [_optimizer(tmp_path / "model.py", 9, "fused")]}
    e = _export(tmp_path / "train.py", sites=sites, optimizer_fusion="fused")
    diff = to_diff(e, device="cpu", cwd=str(tmp_path))
    assert (
        "+        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1, **{**extra_args, 'fused': True})"
        in diff
    )
    assert "# model.py:9: AdamW(...) takes **extra_args: the measured fused=True is merged over it" in diff
    (tmp_path / "model.py").write_text(_MODEL.replace("weight_decay=0.1)", "weight_decay=0.1, **extra_args, **more)"))
    diff = to_diff(e, device="cpu", cwd=str(tmp_path))
    assert "\n@@ " not in diff
    assert (
        "model.py:9: AdamW(...) takes **kwargs, which may hold them: give it fused=True: "
        "torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1, fused=True, **extra_args, **more)"
    ) in _notes(diff)
    elsewhere = tmp_path / "lib"
    elsewhere.mkdir()
    (elsewhere / "model.py").write_text(_MODEL)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.py").write_text(_TRAIN)
    sites = {"loaders": [], "optimizers": [_optimizer(elsewhere / "model.py", 9, "fused")]}
    e = _export(tmp_path / "run" / "train.py", sites=sites, optimizer_fusion="fused")
    diff = to_diff(e, device="cpu", cwd=str(tmp_path / "run"))
    assert "\n@@ " not in diff
    assert (
        f"{elsewhere / 'model.py'}:9: write return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=0.1, "
        "fused=True)"
    ) in _notes(diff)


def test_a_study_without_sites_edits_the_script_s_calls_as_before_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(_LOADERS)
    diff = to_diff(_export(tmp_path / "train.py", num_workers=2), device="cpu", cwd=str(tmp_path))
    assert any(n.startswith("the study recorded no DataLoader or optimizer sites") for n in _notes(diff))


# -------------------------------------------------------------------------------- from a real trial


@needs_patch
def test_the_diff_of_a_trial_holds_what_it_ran(classifier: Path) -> None:
    """A trial of classifier.py with 1 worker and fused AdamW on this CPU: the diff sets -j's default to 1
    (the loader keeps args.workers), leaves the validation loader and both pin_memory=True alone, and
    makes tinymodel.py's AdamW fused."""
    cfg = TrialConfig(
        pipeline=script.spec_of(str(classifier), ["--steps", "40"]),
        warmup_steps=1,
        timed_steps=2,
        window=1,
        num_threads=1,
        num_workers=1,
        optimizer_fusion="fused",
    )
    e = Export.from_result(cfg, worker.run(cfg), environment={"device": "cpu"})
    assert e.sites is not None
    diff = to_diff(e, device="cpu", cwd=str(classifier.parent))
    _apply(classifier.parent, diff)
    after = classifier.read_text()
    assert 'parser.add_argument("-j", "--workers", type=int, default=1)' in after
    assert "num_workers=args.workers, pin_memory=True)" in after
    assert "val_loader = DataLoader(val, batch_size=8, num_workers=0, pin_memory=True)" in after
    call = next(
        n
        for n in ast.walk(ast.parse((classifier.parent / "tinymodel.py").read_text()))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.optim.AdamW"
    )
    assert {k.arg: ast.unparse(k.value) for k in call.keywords} == {"lr": "lr", "weight_decay": "0.1", "fused": "True"}


UNEDITED = Path(__file__).parents[2] / "trial" / "loop" / "script" / "scripts" / "unedited" / "train.py"


@needs_patch
def test_the_batch_of_an_unedited_script_is_written_where_its_dataloader_takes_it(tmp_path: Path) -> None:
    """A script with no at.batch_size(): the trial handed its batch over through its DataLoader, and the diff
    writes it there: batch_size=args.batch_size stays, the option's default becomes the measured batch."""
    target = tmp_path / "train.py"
    shutil.copy(UNEDITED, target)
    cfg = TrialConfig(
        pipeline=script.spec_of(str(target), ["--steps", "20"]), warmup_steps=1, timed_steps=2, window=1, batch_size=16
    )
    e = Export.from_result(cfg, worker.run(cfg), environment={"device": "cpu"})
    diff = to_diff(e, device="cpu", cwd=str(tmp_path))
    _apply(tmp_path, diff)
    after = target.read_text()
    assert 'parser.add_argument("--batch-size", type=int, default=16)' in after, diff
    assert "DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)" in after


def test_an_lr_the_script_scales_with_its_batch_option_gets_no_factor_from_the_diff(tmp_path: Path) -> None:
    """lr = 1e-3 * args.batch_size / 8: the diff sets --batch-size's default, and the script's own arithmetic
    scales its lr for it, as in the trial; on 2 GPUs the per-rank batch is half the global batch, so the diff
    puts the factor for the ranks on it (the linear rule: 2)."""
    target = tmp_path / "train.py"
    source = UNEDITED.read_text()
    target.write_text(
        source.replace("model.parameters(), lr=1e-3)", "model.parameters(), lr=1e-3 * args.batch_size / 8)")
    )
    diff = to_diff(_export(target, batch_size=32, lr_scaling="linear"), device="cpu", cwd=str(tmp_path))
    assert not any("lr=" in line for line in _changed(diff)), diff
    assert any("default=32" in line for line in _changed(diff)), diff
    on_two = to_diff(_export(target, batch_size=16, gpus=2, lr_scaling="linear"), device="cpu", cwd=str(tmp_path))
    assert any("lr=1e-3 * args.batch_size / 8 * 2)" in line for line in _changed(on_two)), on_two


def test_a_study_without_sites_writes_the_batch_into_each_dataloader_built_with_the_script_s_own(
    tmp_path: Path,
) -> None:
    target = tmp_path / "train.py"
    target.write_text(
        _LOADERS.replace("val = DataLoader([1, 2, 3], batch_size=1", "val = DataLoader([1, 2, 3], batch_size=5")
    )
    diff = to_diff(_export(target, batch_size=4, num_workers=4, pin_memory=True), device="cpu", cwd=str(tmp_path))
    assert _changed(diff) == [
        "-train = DataLoader([1, 2, 3], batch_size=1, num_workers=args.workers, pin_memory=True)",
        "+train = DataLoader([1, 2, 3], batch_size=4, num_workers=args.workers, pin_memory=True)",
    ]  # the validation loader, built with another batch, keeps its own


def test_an_lr_the_script_sets_itself_each_step_is_named_with_the_factor(tmp_path: Path) -> None:
    """The trial scaled the lr the script set before each step (its own schedule, trial/loop/script/lr.py);
    the diff scales the constructor's lr, which that schedule overwrites, so it names what to multiply."""
    path = Path(__file__).parents[2] / "trial" / "loop" / "script" / "scripts" / "configured" / "accumulating.py"
    args = ["--batch_size=6", "--gradient_accumulation_steps=2", "--learning_rate=0.005"]
    mine = {"baseline": {"batch_size": 6}, "own_accumulation": 2, "batch_size": 12}
    scheduled = _optimizer(path, 43, "none") | {"own_schedule": True}
    notes = _notes(to_diff(_export(path, args, {"loaders": [], "optimizers": [scheduled]}, **mine)))
    assert any("sets its optimizer's lr itself" in n and "multiply what it sets by 1.41421" in n for n in notes), notes
    plain = _export(path, args, {"loaders": [], "optimizers": [_optimizer(path, 43, "none")]}, **mine)
    assert not any("sets its optimizer's lr itself" in n for n in _notes(to_diff(plain)))


def test_gpus_for_a_script_with_no_process_group_is_said_with_the_torchrun_command(tmp_path: Path) -> None:
    """No line of the script can make it data-parallel without a process group: the diff says what
    `autotune run` under torchrun applies; the lr is scaled for the global batch of 2 ranks (AdamW: sqrt 2)."""
    target = tmp_path / "train.py"
    shutil.copy(UNEDITED, target)
    diff = to_diff(_export(target, sites={"loaders": [], "optimizers": []}, batch_size=8, gpus=2), device="cpu")
    notes = _notes(diff)
    assert any(
        n.startswith("gpus 2: one process per GPU")
        and "`torchrun --nproc-per-node 2 -m autotune run --config best.yaml SCRIPT ARGS` applies it" in n
        for n in notes
    ), notes
    assert "+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * 1.41421)" in _changed(diff), diff
    assert not any("DataLoader" in line for line in _changed(diff)), diff


@needs_patch
def test_the_model_knobs_of_an_unedited_script_are_written_as_plain_torch_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial of the unedited script at bf16, channels_last and 2 checkpointed blocks: the diff writes each as
    torch lines after `optimizer = ...(model.parameters(), ...)`, where `model = Net()` is the class the trial
    found; the patched script, run alone, runs them: its convolutions compute in bf16 on channels_last
    weights, the first 2 blocks' run twice a step (recomputed in backward), and the model hands back fp32."""
    target = tmp_path / "train.py"
    shutil.copy(UNEDITED, target)
    knobs = {"precision": "bf16", "channels_last": True, "checkpoint_segments": 2}
    cfg = TrialConfig(pipeline=script.spec_of(str(target)), warmup_steps=1, timed_steps=2, window=1, **knobs)
    e = Export.from_result(cfg, worker.run(cfg), environment={"device": "cpu"})
    assert e.sites is not None and e.sites["model"] == {"class": "Net", "checkpointed": ["blocks.0", "blocks.1"]}
    diff = to_diff(e, device="cpu", cwd=str(tmp_path))
    assert not any(n.startswith(tuple(knobs)) for n in _notes(diff)), _notes(diff)
    _apply(tmp_path, diff)
    after = target.read_text()
    assert (
        "torch.nn.Module.to(model, memory_format=torch.channels_last)" in after
        and "_checkpoint(model.get_submodule(_block))" in after
    )
    # Run alone, in this process: a global hook sees what each module ran.
    convs: list[tuple[torch.dtype, bool]] = []

    def watch(module: torch.nn.Module, args: Any, out: Any) -> None:
        if isinstance(module, torch.nn.Conv2d):
            convs.append((out.dtype, module.weight.is_contiguous(memory_format=torch.channels_last)))

    handle = torch.nn.modules.module.register_module_forward_hook(watch)
    monkeypatch.setattr(sys, "argv", [str(target), "--steps", "1"])
    try:
        ran = runpy.run_path(str(target), run_name="__main__")
    finally:
        handle.remove()
    assert convs and all(c == (torch.bfloat16, True) for c in convs), convs
    assert len(convs) == 7  # the stem and 4 blocks forward, the 2 checkpointed blocks' again in backward
    assert ran["model"](torch.randn(2, 3, 16, 16)).dtype == torch.float32  # handed back for the loss outside it
