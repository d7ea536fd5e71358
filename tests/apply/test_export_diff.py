"""`export --format diff`: a unified diff against a script study's own script. Each diff is applied with
GNU patch (as the user would), then the patched source is re-read, or run: the README example trains
and its DataLoader and optimizer get the measured arguments."""

from __future__ import annotations

import ast
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

from autotune.apply.export import render
from autotune.apply.export.diff import to_diff
from autotune.cli import main
from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.core.errors import ConfigError
from autotune.pipelines import script
from tests.pipelines.script_helpers import EXAMPLE, images

__all__ = ["images"]  # the fixture, used by name

needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed")


def _export(path: Path, args: list[str] | None = None, **knobs: Any) -> Export:
    cfg = TrialConfig(pipeline=script.spec_of(str(path), args or []), **knobs)
    return Export(config=cfg, environment={"device": "cpu"}, speedup=1.25)


def _patched(tmp_path: Path, source: str, device: str = "cpu", **knobs: Any) -> tuple[str, str]:
    """Write `source` as train.py in tmp_path, export a diff for `knobs` measured on `device` from there,
    apply it with patch: the diff and the patched source."""
    target = tmp_path / "train.py"
    target.write_text(source)
    diff = to_diff(_export(target, **knobs), device=device, cwd=str(tmp_path))
    (tmp_path / "tuned.diff").write_text(diff)
    if "\n@@ " not in diff:  # no hunk: patch calls a diff of comments only garbage
        return diff, target.read_text()
    run = subprocess.run(["patch", "-p0", "-i", "tuned.diff"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return diff, target.read_text()


def _call(source: str, name: str) -> ast.Call:
    return next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(name)
    )


def _kwargs(call: ast.Call) -> dict[str, Any]:
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg and isinstance(k.value, ast.Constant)}


# ------------------------------------------------------------------------------ the README example


@needs_patch
def test_the_patched_example_trains_with_the_measured_loader_and_optimizer(
    images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """plain_script.py, copied, patched with the diff, and run alone (no trial): it trains, its DataLoader
    is built with the measured workers and prefetch, its SGD steps with foreach, zero_grad keeps grads."""
    _, patched = _patched(
        tmp_path,
        EXAMPLE.read_text(),
        num_workers=1,
        prefetch_factor=3,
        persistent_workers=True,
        optimizer_fusion="foreach",
        set_to_none=False,
        precision="bf16",
    )
    assert "at.autocast()" not in patched and "torch.autocast('cpu', dtype=torch.bfloat16)" in patched
    loaders: list[dict[str, Any]] = []
    original = DataLoader.__init__

    def record(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        loaders.append({k: getattr(self, k) for k in ("num_workers", "prefetch_factor", "persistent_workers")})

    monkeypatch.setattr(DataLoader, "__init__", record)
    steps: list[Any] = []
    hook = register_optimizer_step_post_hook(lambda opt, a, k: steps.append(dict(opt.param_groups[0])))
    monkeypatch.setattr(sys, "argv", ["train.py", str(images), "--epochs", "1", "--size", "16", "--width", "4"])
    try:
        runpy.run_path(str(tmp_path / "train.py"), run_name="__main__")
    finally:
        hook.remove()
    assert loaders == [{"num_workers": 1, "prefetch_factor": 3, "persistent_workers": True}]
    assert steps and steps[0]["foreach"] is True
    loss = float(capsys.readouterr().out.split("loss")[-1])
    assert loss == loss and loss > 0  # a finite loss: it trained


@needs_patch
def test_a_best_that_is_the_baseline_is_an_empty_diff_patch_applies_as_nothing(tmp_path: Path) -> None:
    """README's `autotune export --format diff -o tuned.diff && patch -p0 < tuned.diff` for a study whose best
    is the script as written: a diff of comments alone is "Only garbage" to patch (exit 2); an empty one is
    applied as nothing."""
    target = Path(shutil.copy(EXAMPLE, tmp_path / "train.py"))
    before = target.read_text()
    text = render("diff", _export(target))
    assert text == ""
    (tmp_path / "tuned.diff").write_text(text)
    with (tmp_path / "tuned.diff").open() as diff:
        run = subprocess.run(["patch", "-p0"], stdin=diff, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert target.read_text() == before


def test_a_diff_that_changes_the_training_says_so_before_it_is_applied() -> None:
    e = _export(EXAMPLE, precision="bf16")
    e = Export(
        config=e.config,
        training_math={"verdict": "differs", "changes": ["precision fp32 -> bf16"]},
        parity={"verdict": "not checked", "reason": "the budget left was shorter than the check"},
        confirmed={"verdict": "one round: a single draw (x1.82), not yet a measured gain"},
    )
    head = to_diff(e).split("\n--- ")[0]
    assert (
        "# it trains differently: precision fp32 -> bf16; parity: not checked (the budget left was shorter "
        "than the check)\n# confirmation: one round: a single draw (x1.82), not yet a measured gain"
    ) in head


def test_the_diff_names_the_script_from_where_it_is_applied(tmp_path: Path) -> None:
    """patch and git apply refuse absolute names and `..`: a script outside the working folder is named
    from its own folder, and the header says where to apply it."""
    text = to_diff(_export(EXAMPLE, num_workers=2), device="cpu", cwd=str(tmp_path))
    assert "--- plain_script.py\n+++ plain_script.py\n" in text
    assert f"# apply it from {EXAMPLE.parent}: patch -p0" in text
    inside = to_diff(_export(EXAMPLE, num_workers=2), device="cpu", cwd=str(EXAMPLE.parents[2]))
    assert "--- tests/external_pipeline/plain_script.py\n" in inside and "apply it:" in inside


# -------------------------------------------------------------------------------- what is rewritten

_SOURCE = '''"""naïve: a non-ASCII docstring shifts byte columns."""
import torch
from torch.utils.data import DataLoader

def main(loader_kw):
    data = torch.utils.data.TensorDataset(torch.zeros(8, 2))
    a = DataLoader(data, 4, True, None, None, 0, None, False)
    b = DataLoader(data, batch_size=4, **loader_kw)
    c = torch.utils.data.DataLoader(
        data,
        batch_size=4,
        num_workers=2,
        prefetch_factor=8,
    )
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    opt.zero_grad(True)
    model.zero_grad()
    return a, b, c'''  # no newline at the end


@needs_patch
def test_call_arguments_are_rewritten_where_they_stand(tmp_path: Path) -> None:
    diff, patched = _patched(
        tmp_path,
        _SOURCE,
        "NVIDIA H200",
        batch_size=4,  # the script's own (its DataLoaders'): the training is the script's
        num_workers=3,
        pin_memory=True,
        optimizer_fusion="fused",
        set_to_none=False,
    )
    tree = ast.parse(patched)
    a, b, c = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("DataLoader")]
    assert ast.unparse(a) == "DataLoader(data, 4, True, None, None, 3, None, True)"  # positional, replaced
    assert _kwargs(c) == {"batch_size": 4, "num_workers": 3, "prefetch_factor": 2, "pin_memory": True}
    # **kwargs may already hold the knob: added beside it, it could be passed twice (a TypeError), so the
    # measured keywords are merged over the mapping, and win whatever it holds.
    assert ast.unparse(b) == "DataLoader(data, batch_size=4, **{**loader_kw, 'num_workers': 3, 'pin_memory': True})"
    note = (
        "# line 8: DataLoader(...) takes **loader_kw: the measured num_workers=3, pin_memory=True are merged "
        "over it, so what ran holds whatever it carries\n"
    )
    assert note in diff
    merged = eval(ast.unparse(b).replace("DataLoader", "dict").replace("data, ", ""), {"loader_kw": {"num_workers": 1}})
    assert merged == {"batch_size": 4, "num_workers": 3, "pin_memory": True}  # no keyword passed twice
    assert _kwargs(_call(patched, "AdamW")) == {"lr": 1e-3, "foreach": False, "fused": True}
    assert ast.unparse(_call(patched, "opt.zero_grad")) == "opt.zero_grad(False)"
    assert ast.unparse(_call(patched, "model.zero_grad")) == "model.zero_grad(set_to_none=False)"
    assert patched.endswith("return a, b, c") and patched.startswith('"""naïve')
    assert "\\ No newline at end of file" in diff


@needs_patch
def test_global_lines_are_added_after_the_imports_only_where_the_script_sets_none(tmp_path: Path) -> None:
    source = "import os\nfrom torch import nn\n\nprint(nn)\n"
    _, patched = _patched(tmp_path, source, "NVIDIA H200", cudnn_benchmark=True, num_threads=2)
    assert patched.splitlines()[:5] == [
        "import os",
        "from torch import nn",
        "import torch",
        "torch.backends.cudnn.benchmark = True  # autotune: cudnn_benchmark",
        "torch.set_num_threads(2)  # autotune: num_threads",
    ]
    # the script's own line runs after the trial set it, so its value is what ran: kept, and said
    own = "import torch\ntorch.set_num_threads(1)\ntorch.backends.cudnn.benchmark = False\n"
    diff, patched = _patched(tmp_path, own, "NVIDIA H200", cudnn_benchmark=True, num_threads=2, num_workers=1)
    assert patched == own
    assert "the script sets it itself (line 3)" in diff and "calls torch.set_num_threads itself (line 2)" in diff


@needs_patch
def test_tf32_is_written_as_its_two_flags_where_the_script_sets_neither(tmp_path: Path) -> None:
    _, patched = _patched(tmp_path, "import torch\n\nprint(torch)\n", "NVIDIA H200", tf32=True)
    assert patched.splitlines()[1:3] == [
        "torch.backends.cuda.matmul.allow_tf32 = True  # autotune: tf32",
        "torch.backends.cudnn.allow_tf32 = True  # autotune: tf32",
    ]
    own = "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n"
    diff, patched = _patched(tmp_path, own, "NVIDIA H200", tf32=True)
    assert "tf32=True: the script sets it itself (line 2)" in diff
    assert "torch.backends.cudnn.allow_tf32 = True  # autotune: tf32" in patched  # the flag it leaves alone
    _, on_cpu = _patched(tmp_path, "import torch\n", "cpu", tf32=True)
    assert "allow_tf32" not in on_cpu  # no effect where it was measured: never written


_API = """import torch
from autotune import script as at

args_batch = 8
model = at.model(torch.nn.Linear(2, 2))
batch = at.batch_size(args_batch)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = at.scaler()
with at.autocast():
    pass
"""


@needs_patch
def test_an_optimizer_without_the_flags_is_left_as_written_and_said(tmp_path: Path) -> None:
    """pytorch/examples' mnist builds Adadelta, which has no fused/foreach pair: the search does not tune
    its fusion (the space says why), and the diff leaves the optimizer as written."""
    source = "import torch\nopt = torch.optim.Adadelta([torch.zeros(1, requires_grad=True)], lr=1.0)\n"
    diff, patched = _patched(tmp_path, source, optimizer_fusion="fused", num_workers=1)
    assert patched == source
    assert "optimizer_fusion" not in diff  # not a knob of this script: nothing to say about it


def test_the_cooperative_calls_a_best_changes_become_the_torch_calls(tmp_path: Path) -> None:
    """Outside a trial each at.* call is the identity: the ones whose knob the best changes are written as
    torch calls, so the script run alone runs what was measured; at.batch_size keeps its call, with the
    measured batch as its default, and SGD's lr is scaled by the linear rule for it."""
    _, patched = _patched(
        tmp_path,
        _API,
        precision="fp16",
        channels_last=True,
        batch_size=16,
        lr_scaling="linear",
        optimizer_fusion="none",
    )
    assert "model = torch.nn.Linear(2, 2).to(memory_format=torch.channels_last)" in patched
    assert "batch = at.batch_size(16)" in patched
    assert "optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * 2)\n" in patched  # foreach=None is off on CPU
    assert (
        "scaler = torch.amp.GradScaler('cpu')" in patched
        and "with torch.autocast('cpu', dtype=torch.float16):" in patched
    )
    # bf16 needs no scaler, and at.scaler() is a disabled one outside a trial: it stays
    _, patched = _patched(tmp_path, _API, precision="bf16")
    assert "scaler = at.scaler()" in patched and "at.model(" in patched


@needs_patch
def test_a_measured_fp32_over_the_script_s_own_amp_turns_it_off(tmp_path: Path) -> None:
    """at.autocast("bf16") runs the script's own bf16 outside a trial: a best measured in fp32 must be
    written as autocast turned off, or the patched script would still run bf16; and a script whose own
    fp16 scaler is on gets it turned off with it."""
    source = _API.replace("at.autocast()", 'at.autocast("bf16")')
    _, patched = _patched(tmp_path, source, precision="fp32", baseline={"precision": "bf16"})
    assert "with torch.autocast('cpu', enabled=False):" in patched and "scaler = at.scaler()" in patched
    source = _API.replace("at.autocast()", 'at.autocast("fp16")').replace("at.scaler()", "at.scaler(True)")
    _, patched = _patched(tmp_path, source, precision="fp32", baseline={"precision": "fp16"})
    assert "with torch.autocast('cpu', enabled=False):" in patched
    assert "scaler = torch.amp.GradScaler('cpu', enabled=False)" in patched


# ------------------------------------------------------------------------------------- bad input


def test_a_script_not_on_this_machine_is_exit_2_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "train.py"
    gone.write_text(EXAMPLE.read_text())
    e = _export(gone, num_workers=2)
    gone.unlink()
    with pytest.raises(ConfigError, match="not readable on this machine"):
        to_diff(e)
    import autotune.cli.study as cli_study
    import autotune.search.store.results as results

    monkeypatch.setattr(cli_study, "_study", lambda args: None)
    monkeypatch.setattr(results, "best_export", lambda study, storage, out: e)
    assert main(["export", "--format", "diff", "-o", str(tmp_path / "tuned.diff")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert not (tmp_path / "tuned.diff").exists()


def test_a_study_that_is_not_a_script_has_no_diff() -> None:
    with pytest.raises(ConfigError, match="--format diff needs a script study"):
        render("diff", Export(config=TrialConfig(), environment={"device": "cpu"}))


def test_the_example_diff_changes_only_the_lines_of_the_measured_knobs(tmp_path: Path) -> None:
    """The loader's `num_workers=args.workers` ran as the measured 0 (the option's default): it stays the
    user's argument; the optimizer gets its flag; nothing else changes."""
    text = to_diff(_export(EXAMPLE, optimizer_fusion="foreach"), device="cpu", cwd=str(tmp_path))
    changed = [line for line in text.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == [
        "-    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)",
        "+    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4, foreach=True)",
    ]
