"""benchmarks/script_example.py's mechanics, with nothing timed: bad input is one line and exit 2, and its
alone runs are autotune's own runner (trial/probes/alone.py: the script as written, timed by its optimizer
steps, the DataLoader's batches counted, the run ended after the timed steps), not a copy of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.pipelines.script_helpers import ENV

BENCH = REPO_ROOT / "benchmarks" / "script_example.py"
SCRIPT = """import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=1)
args = p.parse_args()
loader = DataLoader(TensorDataset(torch.randn(12, 3), torch.randn(12, 1)), batch_size=4)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
print("trained to the end")
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], cwd=cwd, env=ENV, capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--rounds", "0"], "--rounds 0: at least 1"),
        (["--budget", "soon"], "--budget"),
        (["--search-args", "--study x"], "--study is set by this script"),
        (["--bogus"], "unrecognized arguments"),
        (["--script", "nowhere/train.py"], "--script nowhere/train.py: no such file"),
        (["--aa", "-1"], "--aa -1: at least 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    r = run(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()  # nothing made before the input is checked


def test_the_alone_runs_are_autotunes_own_runner_not_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's alone runs go through autotune/trial/probes/alone.py (the search's own alone rounds):
    the script timed as written and stopped after its timed steps; the benchmark keeps no runner of its own."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("script_example", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert not hasattr(bench, "child") and "register_optimizer_step_post_hook" not in BENCH.read_text()
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    (tmp_path / "train.py").write_text(SCRIPT)
    folder = tmp_path / "round-0"
    folder.mkdir()
    args = argparse.Namespace(warmup=1, steps=4)
    got = bench.alone(tmp_path / "train.py", ["--epochs", "3"], args, folder, "as-written")  # 9 steps, stopped
    assert "trained to the end" not in (folder / "as-written.log").read_text()
    assert got["batch_sizes"] == [4] and got["samples"] == 16  # 4 timed steps of the loader's 4
    assert got["samples_per_s"] == pytest.approx(4 * got["steps_per_s"])
    with pytest.raises(RuntimeError, match="ended after 3 optimizer step"):
        bench.alone(tmp_path / "train.py", ["--epochs", "1"], args, folder, "short")  # 3 steps: too few
