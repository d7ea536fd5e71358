"""benchmarks/script_example.py's mechanics, with nothing timed: bad input is one line and exit 2, and its
runner times a script as written (the optimizer-step hook, the DataLoader's batches counted, the run
ended after the timed steps)."""

from __future__ import annotations

import json
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
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    r = run(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and said in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()  # nothing made before the input is checked


def test_the_runner_times_the_script_as_written_and_stops_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = tmp_path / "r.json"
    common = ["--child", str(tmp_path / "train.py"), "--result", str(result), "--warmup", "1", "--steps", "4"]
    r = run(*common, "--", "--epochs", "3", cwd=tmp_path)  # 9 steps: stopped after the 1 + 4 + 1 it stamps
    assert r.returncode == 0, r.stderr
    assert "trained to the end" not in r.stdout
    got = json.loads(result.read_text())
    assert got["batch_sizes"] == [4] and got["samples"] == 16  # 4 timed steps of the loader's 4
    assert got["samples_per_s"] == pytest.approx(4 * got["steps_per_s"])
    r = run(*common, "--", "--epochs", "1", cwd=tmp_path)  # 3 steps: fewer than it needs
    assert r.returncode == 1 and "ended after 3 optimizer steps" in r.stderr
