"""`autotune run --config best.yaml train.py ARGS`: the README's example script trained to its own end with
a script study's config applied through the trial's seams, no edit to the script; the `applied` record
it writes is the trial's for the same config. Bad input is one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.core.config import TrialConfig
from autotune.core.knobs import cudnn_benchmark
from autotune.core.configfile import Export, to_yaml
from autotune.pipelines.script import spec_of
from autotune.pipelines.unet.data import make_data
from autotune.trial.processes.launcher import run_trial
from tests.pipelines.script_helpers import EXAMPLE

UNEDITED = Path(__file__).parents[1] / "trial" / "loop" / "script" / "scripts" / "unedited" / "train.py"

# The measured knobs: none of them the script's own (it builds its loader with 0 workers, SGD without
# flags, zero_grad() to None, fp32, torch's threads).
KNOBS: dict[str, Any] = {
    "num_workers": 1,
    "pin_memory": False,
    "persistent_workers": True,
    "optimizer_fusion": "foreach",
    "set_to_none": False,
    "num_threads": 1,
    "precision": "bf16",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("run") / "data", 24, (64, 64))  # 3 steps an epoch at batch 8


def best_yaml(folder: Path, script: Path, data: Path, **knobs: Any) -> tuple[Path, TrialConfig]:
    spec = spec_of(str(script), [str(data), "--size", "32", "--epochs", "50"])
    cfg = TrialConfig(pipeline=spec, warmup_steps=1, timed_steps=2, window=1, **knobs)
    path = folder / "best.yaml"
    path.write_text(to_yaml(Export(cfg)))
    return path, cfg


def knob_effects(applied: dict[str, Any]) -> dict[str, Any]:
    """Each knob's requested value and the one in effect, and the loaders and optimizers the script built
    (not the counts of a run: how many steps, how many autocasts)."""
    out = {k: (v["requested"], v["in_effect"]) for k, v in applied.items() if k != "script" and "requested" in v}
    script = applied["script"]
    return out | {"loaders": script["loaders"], "optimizers": script["optimizers"]}


def test_the_readme_example_trains_to_its_end_with_the_measured_knobs_as_a_trial_applies_them(
    repo_on_path: Path, tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Path(shutil.copy(EXAMPLE, tmp_path / "train.py"))
    before = script.read_text()
    config, cfg = best_yaml(tmp_path, script, data, **KNOBS)
    trial = run_trial(cfg, tmp_path / "trial", timeout_s=300)
    out = tmp_path / "applied.json"
    code = main(
        ["run", "--config", str(config), "--out", str(out), str(script), str(data), "--size", "32", "--epochs", "2"]
    )
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "epoch 0:" in said.out and "epoch 1:" in said.out  # the script's own epochs, to its end
    assert script.read_text() == before  # no edit to the script
    record = json.loads(out.read_text())
    assert record["exit_code"] == 0 and record["applied"]["script"]["optimizer_steps"] == 2 * 3
    run, measured = knob_effects(record["applied"]), knob_effects(dict(trial.applied))
    assert run == measured
    for knob in ("num_workers", "persistent_workers", "optimizer_fusion", "set_to_none", "num_threads", "precision"):
        assert run[knob] == (KNOBS[knob], KNOBS[knob]), knob  # the measured knobs ran, not the script's own
    assert "autotune run: 6 optimizer step(s), exit code 0" in said.err and str(out) in said.err


def test_a_script_that_exits_with_an_error_hands_its_code_back(
    repo_on_path: Path, tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('own message')\nsys.exit(7)\n")
    config, _ = best_yaml(tmp_path, script, data)
    out = tmp_path / "run" / "applied.json"
    assert main(["run", "--config", str(config), str(script)]) == 7  # --out: beside the config
    assert "own message" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["exit_code"] == 7 and record["applied"]["script"]["optimizer_steps"] == 0


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = Path(shutil.copy(EXAMPLE, tmp_path / "train.py"))
    config, _ = best_yaml(tmp_path, script, data)
    unet = tmp_path / "unet.yaml"
    unet.write_text(to_yaml(Export(TrialConfig())))
    several = tmp_path / "gpus.yaml"
    several.write_text(config.read_text().replace("gpus: 1", "gpus: 2"))
    (tmp_path / "fsdp").mkdir()
    fsdp, _ = best_yaml(tmp_path / "fsdp", script, data, baseline={"parallel": "fsdp"})  # hand-edited
    cases = [
        (["--config", str(tmp_path / "nope.yaml"), str(script)], "nope.yaml"),
        (["--config", str(unet), str(script)], "not a script"),
        (["--config", str(config), str(tmp_path / "missing.py")], "missing.py"),
        (["--config", str(several), str(script)], "torchrun --nproc-per-node 2 -m autotune run"),
        (["--config", str(fsdp), str(script)], "--baseline sets parallel, which --pipeline"),
    ]
    for argv, said in cases:
        assert main(["run", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "run").exists()  # nothing written


TWO_LOADERS = """import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
train = DataLoader(data, batch_size=4, num_workers=0)
val = DataLoader(data, batch_size=4, num_workers=0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(20):
    for x, y in train:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
with torch.no_grad():
    print("val", sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in val))
"""


def test_the_loader_knobs_go_only_where_the_trial_measured_them(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trial iterated the training loader only: `autotune run` gives it the measured workers, as the diff
    would, and the validation loader keeps the script's own 0 (said in the record)."""
    script = tmp_path / "train.py"
    script.write_text(TWO_LOADERS)
    cfg = TrialConfig(pipeline=spec_of(str(script), []), warmup_steps=1, timed_steps=2, window=1, num_workers=1)
    trial = run_trial(cfg, tmp_path / "trial", timeout_s=300)
    sites = trial.applied["script"]["sites"]
    assert [s["iterated"] for s in sites["loaders"]] == [True, False]
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg, sites=sites)))
    out = tmp_path / "applied.json"
    assert main(["run", "--config", str(config), "--out", str(out), str(script)]) == 0, capsys.readouterr().err
    train, val = json.loads(out.read_text())["applied"]["script"]["loaders"]
    assert train["num_workers"] == 1 and "kept" not in train
    assert val["num_workers"] == 0 and val["kept"].startswith("no trial measured it")
    assert json.loads(out.read_text())["applied"]["num_workers"]["in_effect"] == 1


SEEDED = Path(__file__).parent / "scripts" / "seeded.py"


@pytest.mark.parametrize("knobs", [{}, {"set_to_none": False}], ids=["no change", "same math"])
def test_autotune_run_trains_the_numbers_python_trains(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], knobs: dict[str, Any]
) -> None:
    """Seen on a public script: `autotune run` gave a step-0 loss of 4.1833 where `python train.py` gave
    4.1823: at.seed(1337) handed out the study's seed 0. Every at.* call returns the script's own value
    unless best.yaml changed that knob, so a no-change export and a same-math one train bit for bit."""
    script = Path(shutil.copy(SEEDED, tmp_path / "seeded.py"))
    alone = subprocess.run([sys.executable, str(script), "8"], capture_output=True, text=True, check=True).stdout
    cfg = TrialConfig(pipeline=spec_of(str(script), ["8"]), warmup_steps=1, timed_steps=2, window=1, **knobs)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "applied.json"), str(script), "8"]) == 0
    ran = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss ")]
    assert len(ran) == 8 and ran == alone.splitlines()


@pytest.mark.slow
@pytest.mark.side_by_side
def test_autotune_run_under_torchrun_trains_a_script_with_no_process_group_on_two_ranks(
    repo_on_path: Path, tmp_path: Path
) -> None:
    """The command the error above prints: the process group set up, the model replicated, the loader
    sharded (the trial's seams, trial/loop/script/ranks.py); the script's checkpoint written once, its lines
    printed once, the record written by rank 0."""
    script = Path(shutil.copy(UNEDITED, tmp_path / "train.py"))
    checkpoint = tmp_path / "checkpoint.pt"
    args = ["--steps", "12", "--save", str(checkpoint)]
    cfg = TrialConfig(
        pipeline=spec_of(str(script), args), gpus=2, batch_size=16, warmup_steps=1, timed_steps=2, window=1
    )
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    out = tmp_path / "applied.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + ["-m", "autotune", "run", "--config", str(config), "--out", str(out), str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("step 11 loss") == 1 and run.stdout.count("step 0 loss") == 1, run.stdout
    record = json.loads(out.read_text())
    applied = record["applied"]
    assert record["exit_code"] == 0 and applied["script"]["optimizer_steps"] == 12
    assert applied["gpus"]["in_effect"] == 2 and "replicated Net in place" in applied["gpus"]["why"]
    assert "shared by the 2 ranks on this node" in applied["num_threads"]["why"], applied["num_threads"]
    assert applied["observed"]["global_batch"] == 32
    assert applied["observed"]["ranks"]["torch_save"] == {"written": [1, 0], "skipped": [0, 1]}
    assert checkpoint.exists()


def _run_seeded(tmp_path: Path, capsys: pytest.CaptureFixture[str], **knobs: Any) -> tuple[str, dict[str, Any]]:
    """`autotune run` of seeded.py (8 steps) with `knobs` measured: what it said on stderr, and its record."""
    script = Path(shutil.copy(SEEDED, tmp_path / "seeded.py"))
    cfg = TrialConfig(pipeline=spec_of(str(script), ["8"]), warmup_steps=1, timed_steps=2, window=1, **knobs)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    out = tmp_path / "applied.json"
    assert main(["run", "--config", str(config), "--out", str(out), str(script), "8"]) == 0
    return capsys.readouterr().err, json.loads(out.read_text())


def test_a_run_says_first_what_it_applies_from_best_yaml_knob_by_knob(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the knobs best.yaml changes from the script's own, in the knob table's order; the rest is the
    script's."""
    err, _ = _run_seeded(tmp_path, capsys, set_to_none=False, optimizer_fusion="foreach")
    said = [line for line in err.splitlines() if line.startswith("autotune run:")]
    assert said[0] == (
        "autotune run: applying from best.yaml: optimizer_fusion foreach, set_to_none false "
        "(the rest as the script runs)"
    ), err


def test_a_run_of_the_script_as_written_says_it_applies_nothing(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err, _ = _run_seeded(tmp_path, capsys)
    said = [line for line in err.splitlines() if line.startswith("autotune run:")]
    assert said[0].startswith("autotune run: applying nothing from best.yaml: "), err


NO_BATCH = """import torch

w = torch.zeros(4, requires_grad=True)  # no DataLoader, no model called with a batch: nothing to count but steps
opt = torch.optim.SGD([w], lr=0.1)
for step in range(8):
    ((w - 1) ** 2).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_run_of_a_study_counted_in_optimizer_steps_says_steps_per_s(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script that trains on no batch autotune can count: its study measured steps/s, and so does the run's
    window; a figure labelled samples/s would be the wrong unit."""
    script = tmp_path / "train.py"
    script.write_text(NO_BATCH)
    cfg = TrialConfig(pipeline=spec_of(str(script), []), warmup_steps=1, timed_steps=2, window=1, set_to_none=False)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    out = tmp_path / "applied.json"
    assert main(["run", "--config", str(config), "--out", str(out), str(script)]) == 0
    err, record = capsys.readouterr().err, json.loads(out.read_text())
    assert record["applied"]["throughput"]["unit"] == "steps/s"
    last = err.strip().splitlines()[-1]
    assert "steps/s" in last and "samples/s" not in err, err


def test_the_threads_a_run_sets_are_said_as_set_not_as_torch_default(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, record = _run_seeded(tmp_path, capsys, num_threads=1)
    assert record["applied"]["num_threads"] == {"requested": 1, "in_effect": 1, "why": "torch.set_num_threads(1)"}
    _, record = _run_seeded(tmp_path, capsys, set_to_none=False)  # 0: torch's own count
    assert record["applied"]["num_threads"]["why"] == "0 = torch default"


def test_a_flag_is_recorded_as_a_trial_of_autotune_s_pipelines_records_it(
    repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cudnn.benchmark set on a machine without CUDA: set, read back after the script ran, and recorded as not
    in effect with the reason, as setup_process records it for every kind of job."""
    _, record = _run_seeded(tmp_path, capsys, cudnn_benchmark=True)
    assert record["applied"]["cudnn_benchmark"] == {
        "requested": True,
        "in_effect": False,
        "why": cudnn_benchmark.NO_CUDA,
    }


def test_a_run_says_no_trial_warm_up(repo_on_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial says the extra warm-up steps that drain its loader's prefetched batches; a run is not a trial,
    its window is measured on the way, silently."""
    script = tmp_path / "train.py"
    script.write_text(TWO_LOADERS)
    cfg = TrialConfig(pipeline=spec_of(str(script), []), warmup_steps=1, timed_steps=2, window=1, num_workers=1)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "applied.json"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "autotune trial" not in err and "warm-up" not in err, err


INTERRUPTIBLE = """import sys, time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

started = Path(sys.argv[1])
data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step, deadline = 0, time.monotonic() + 120
while time.monotonic() < deadline:  # trains until Ctrl-C (or two minutes: a test that never sends it ends)
    for x, y in DataLoader(data, batch_size=4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step == 8:
            started.write_text("training")
        time.sleep(0.01)
"""


def test_an_interrupted_run_writes_what_it_applied_so_far_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C in the script's training: `autotune run` still writes its record (the steps so far, each knob's
    effect) and ends with 130, the interrupted code of every command."""
    script = tmp_path / "train.py"
    script.write_text(INTERRUPTIBLE)
    started = tmp_path / "started"
    cfg = TrialConfig(pipeline=spec_of(str(script), [str(started)]), warmup_steps=1, timed_steps=2, window=1)
    cfg = cfg.replace(set_to_none=False)
    config = tmp_path / "best.yaml"
    config.write_text(to_yaml(Export(cfg)))
    out = tmp_path / "applied.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", "--config", str(config), "--out", str(out), str(script)]
        + [str(started)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), run.communicate(timeout=60)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err
    record = json.loads(out.read_text())
    assert record["exit_code"] == 130 and record["applied"]["script"]["optimizer_steps"] >= 8
    assert record["applied"]["set_to_none"]["in_effect"] is False
    assert "interrupted" in err.strip().splitlines()[-1] and str(out) in err, err
