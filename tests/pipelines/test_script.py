"""`--pipeline script:PATH [ARGS]` / `search --script`: the spec, the checks on the file, which knobs a
script can take (from its source), the example run alone, and the export of what to change."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.apply.export import render
from autotune.core.config import TrialConfig
from autotune.core.configfile import Export
from autotune.pipelines import load_pipeline, script, unsupported_of, base_config
from autotune.search.space.reading import load_space
from autotune.search.space.resolve import for_hardware
from autotune.search.space.spec import Fixed
from tests.conftest import REPO_ROOT
from tests.pipelines.framework_helpers import autotune
from tests.pipelines.script_helpers import ENV, EXAMPLE, SCRIPTS, images

__all__ = ["images"]  # a fixture


def test_the_spec_holds_the_absolute_path_and_the_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE.parent)
    spec = base_config("script:plain_script.py 'my data' --epochs 1", None, None, str(tmp_path)).pipeline
    assert spec == f"script:{EXAMPLE} 'my data' --epochs 1"
    assert script.parse(spec) == (str(EXAMPLE), ["my data", "--epochs", "1"])


def test_bad_scripts_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def broken(:\n")
    for path, said in (("missing.py", "no such file"), ("broken.py", "is not valid Python (line 1)")):
        run = autotune("search", "--script", path, "--budget", "30s", "--studies-dir", "out", cwd=tmp_path)
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.py"]  # no study, no studies dir
    run = autotune("search", "--script-args", "x", "--budget", "30s", "--studies-dir", "out", cwd=tmp_path)
    assert run.returncode == 2 and "--script-args needs --script" in run.stderr


def test_a_script_without_a_dataloader_has_the_loader_knobs_fixed_with_why() -> None:
    from autotune.search.space.machine import Hardware

    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(SCRIPTS / "no_loader.py"))))
    off = unsupported_of(job)
    assert {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"} <= off
    assert "precision" not in off and "optimizer_fusion" not in off  # it calls at.autocast(); no-edit knobs
    assert "compile" not in off  # the model its optimizer trains takes it with no edit (its forward compiled)
    assert "channels_last" not in off  # the model its optimizer trains takes it with no edit
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    hw = Hardware(cuda=False, gpu_count=0, cpu_count=2, cpu_bf16=True, apex=False, memory_bytes=None)
    narrowed, notes = for_hardware(space, hw, stages=0, unsupported=off)
    why = "not supported by this pipeline: the script builds no torch DataLoader (none in its source;"
    assert any(n.startswith("num_workers") and why in n for n in notes), notes
    assert narrowed.knobs["num_workers"] == Fixed(0)


def test_the_example_runs_alone_and_trains(images: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), str(images), "--epochs", "3", "--size", "32"],
        env=ENV, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines() if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0], run.stdout


def test_the_example_adds_at_most_ten_lines() -> None:
    assert sum("# at" in line for line in EXAMPLE.read_text().splitlines()) <= 10


def test_the_api_is_the_identity_outside_a_trial() -> None:
    import torch

    from autotune import script as at

    model = torch.nn.Linear(2, 2)
    assert at.model(model) is model and at.seed(7) == 7
    scaler = at.scaler()
    loss = torch.ones(())
    assert not scaler.is_enabled() and scaler.scale(loss) is loss
    with at.autocast():
        assert not torch.is_autocast_enabled()


def _export(**knobs: object) -> str:
    cfg = TrialConfig(pipeline=script.spec_of(str(EXAMPLE), ["data", "--epochs", "1"]), **knobs)  # type: ignore[arg-type]
    return render("script", Export(config=cfg, environment={"device": "cpu"}, speedup=1.3))


def test_the_export_is_what_to_change_in_the_script() -> None:
    assert "no change" in _export()
    text = _export(num_workers=2, prefetch_factor=4, optimizer_fusion="foreach", precision="bf16")
    assert "DataLoader(..., num_workers=2, pin_memory=False, persistent_workers=False, prefetch_factor=4)" in text
    assert "foreach=True" in text and "torch.autocast('cpu', dtype=torch.bfloat16)" in text
    assert "no change" not in text


@pytest.mark.slow
def test_a_search_on_the_example_exports_and_its_best_re_measures(
    images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example as written: a short search, best.yaml, the script export, and `trial` on best.yaml."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = f"{images} --epochs 100 --size 32"
    search = autotune(
        "search", "--script", str(EXAMPLE), "--script-args", args, "--budget", "40s", "--n-trials", "3",
        "--trial-seconds", "1", "--warmup-steps", "1", "--confirm-rounds", "0", "--parity-steps", "0",
        "--seed", "0", cwd=tmp_path,
    )  # fmt: skip
    assert search.returncode == 0, search.stderr[-3000:]
    best = tmp_path / "studies" / "autotune" / "best.yaml"
    assert f"script:{EXAMPLE}" in yaml.safe_load(best.read_text())["workload"]["pipeline"]
    assert "batch_size not searched" not in search.stdout  # its DataLoader's batch, searched with no edit
    # The final lines say how to apply it: the real training with it applied, or the change as a diff.
    assert f"apply it:  autotune run --config {best.relative_to(tmp_path)} {EXAMPLE} {args}" in search.stdout
    printed = next(line for line in search.stdout.splitlines() if "or edit your source:" in line)
    words = shlex.split(printed.split("or edit your source:", 1)[1].split("(", 1)[0])
    assert words[:3] == ["autotune", "export", "--format"]
    diff = autotune(*words[1:], cwd=tmp_path)
    text = (tmp_path / "tuned.diff").read_text()
    # A change starts with what it is; no change is an empty diff (patch -p0 applies it as nothing), said.
    assert diff.returncode == 0 and (text.startswith("#") or (not text and "no change to apply" in diff.stderr))
    export = autotune("export", "--format", "script", "-o", "changes.txt", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert f"# autotune export for {EXAMPLE}" in (tmp_path / "changes.txt").read_text()
    again = autotune("trial", "--config", str(best), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads((best.parent / "trial" / "result.json").read_text())
    assert result["status"] == "ok" and result["applied"]["script"]["optimizer_steps"] >= 2


def test_the_docs_example_is_the_file_it_names() -> None:
    """docs/own-model.md's script example is plain_script.py as the suite runs it, its docstring aside."""
    import ast

    from tests.docs_pages import DOCS, python_block

    block = python_block(DOCS / "own-model.md", "from autotune import script as at  # at")
    shipped = ast.parse(EXAMPLE.read_text())
    shipped.body = shipped.body[1:]
    assert ast.dump(ast.parse(block)) == ast.dump(shipped)


def test_the_export_of_a_script_without_a_loader_names_no_dataloader_line() -> None:
    cfg = TrialConfig(pipeline=script.spec_of(str(SCRIPTS / "no_loader.py")), optimizer_fusion="fused")
    text = render("script", Export(config=cfg, environment={"device": "cpu"}))
    assert "DataLoader(" not in text and "fused=True" in text


def test_a_worker_names_a_script_as_the_study_records_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.cli.search import _allowed

    monkeypatch.chdir(EXAMPLE.parent)
    assert _allowed(["script:plain_script.py data", "unet"]) == [f"script:{EXAMPLE} data", "unet"]


def test_a_script_that_fails_before_its_first_step_stops_the_search(tmp_path: Path) -> None:
    """Every config of a script that raises at start-up fails the same way: the search stops after a few
    in a row, exit 2, with the script's own error and how to see it, instead of failing trial after trial."""
    bad = tmp_path / "bad.py"
    bad.write_text('from torch.utils.data import DataLoader\n\nraise FileNotFoundError("data/train: no such folder")\n')
    run = autotune("search", "--script", str(bad), "--budget", "2m", "--seed", "0", cwd=tmp_path)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    err = [line for line in run.stderr.splitlines() if line.startswith("autotune: error:")]
    assert len(err) == 1 and "3 trials in a row failed the same way before any was measured" in err[0], run.stderr
    assert "FileNotFoundError: data/train: no such folder" in err[0] and f"python {bad}" in err[0]
    import optuna

    from autotune.search.store.storage import open_storage

    study = optuna.load_study(study_name="autotune", storage=open_storage(str(tmp_path / "studies.db")))
    assert len(study.get_trials(deepcopy=False)) == 3
