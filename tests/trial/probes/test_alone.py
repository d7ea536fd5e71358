"""One run of a script alone: the script as `python script ARGS` runs it (no trial: every at.* call is the
identity), timed by the trial's Clock driven from its optimizer steps (its warm-up excluded, its window
the timed steps), its samples counted from the batches its own DataLoader yielded as a trial counts them
(steps/s, said, without one), ended by the clock after the timed steps, through the script's own
`except Exception`; a script that ends first is a said failure."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.trial.measurement import measure as instruments
from autotune.trial.probes.alone import UNIT_SAMPLES, UNIT_STEPS, AloneFailed, measure, run_alone
from tests.trial.measurement.test_clock import FakeTime

LOADER_SCRIPT = """
import argparse, json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from autotune import script as at
from autotune.pipelines.script import api

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=100)
p.add_argument("--seen", default=None)
args = p.parse_args()
batch = at.batch_size(4)
if args.seen:  # what the at.* calls handed over, outside a trial
    with open(args.seen, "w") as f:
        json.dump({"batch": batch, "argv": sys.argv[1:], "no_trial": api._trial is None}, f)
data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""

NO_LOADER_SCRIPT = """
import torch
from helper import batch  # a sibling module: found through the folder `python` puts first on sys.path
from sizes import SIZE
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100):
    x = torch.randn(batch() * SIZE, 3)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""

# Nested batches ((x, x2), y), each step's seconds said to the test's fake time, and a handler of its own
# around the loop: only a BaseException ends it before `steps` steps.
TIMED_SCRIPT = """
import torch
from torch.utils.data import DataLoader, Dataset
import alone_fake_time

class Pairs(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return (torch.randn(3), torch.randn(3)), torch.randn(1)

model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 0
try:
    for epoch in range(100):
        for (x, _), y in DataLoader(Pairs(), batch_size=4, drop_last=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            steps += 1
            alone_fake_time.advance(10.0 if steps <= 3 else 0.5)  # the first step and the warm-up's are slow
            opt.step()
except Exception:
    pass
raise SystemExit(f"ran on after {steps} steps")
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_samples_come_from_the_scripts_own_loader_and_at_calls_are_the_identity(
    repo_on_path: Path, tmp_path: Path
) -> None:
    script = write(tmp_path, "train.py", LOADER_SCRIPT)
    seen = tmp_path / "seen.json"
    got = run_alone(
        script, ["--seen", str(seen)], warmup=2, steps=5, out=tmp_path / "run" / "alone.json", timeout_s=120
    )
    assert got["unit"] == UNIT_SAMPLES and got["samples"] == 5 * 4 and got["batch_sizes"] == [4]
    assert got["steps"] == 5 and got["samples_per_s"] == pytest.approx(4 * got["steps_per_s"])
    # No trial around it: at.batch_size() returned the script's own value; its argv is its own.
    assert json.loads(seen.read_text()) == {"batch": 4, "argv": ["--seen", str(seen)], "no_trial": True}
    assert (tmp_path / "run" / "alone.log").is_file()


def test_a_script_without_a_loader_is_measured_in_steps_per_second_from_its_home(tmp_path: Path) -> None:
    home = tmp_path / "project"
    write(home, "helper.py", "def batch():\n    return 6\n")
    write(home, "sizes.py", "SIZE = 1\n")
    copy = write(tmp_path / "elsewhere", "train.py", NO_LOADER_SCRIPT)  # a patched copy kept apart
    got = measure(copy, [], warmup=1, steps=3, home=(home,))
    assert got["unit"] == UNIT_STEPS and got["samples_per_s"] is None and got["samples"] is None
    assert got["steps_per_s"] > 0 and got["batch_sizes"] == []
    # The copy's folder first: a module the diff edited, kept beside the copy, is the one imported; the
    # user's others come from the script's own folder.
    write(copy.parent, "helper.py", "def batch():\n    raise SystemExit('the edited helper ran')\n")
    sys.modules.pop("helper")  # measure() runs in this process here; a run alone is a fresh one
    with pytest.raises(SystemExit, match="the edited helper ran"):
        measure(copy, [], warmup=1, steps=3, home=(copy.parent, home))
    for name in ("helper", "sizes"):
        sys.modules.pop(name, None)


def test_a_script_that_ends_before_its_steps_is_a_said_failure(repo_on_path: Path, tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", LOADER_SCRIPT)
    with pytest.raises(AloneFailed, match=r"ended after 10 optimizer step\(s\).*more steps"):
        run_alone(script, ["--epochs", "1"], warmup=3, steps=20, out=tmp_path / "alone.json", timeout_s=120)


def test_the_window_is_the_clocks_after_its_warm_up_and_its_samples_are_counted_as_a_trial_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a fake time the script advances: the first step's end begins the clock, the next 2 are its warm-up
    (10 s each, unseen), the 4 after them are timed (0.5 s each); the nested batches hold 4 samples each."""
    t = FakeTime()
    monkeypatch.setattr(instruments, "time", t)
    monkeypatch.setitem(sys.modules, "alone_fake_time", t)
    got = measure(write(tmp_path, "train.py", TIMED_SCRIPT), [], warmup=2, steps=4)
    assert got["seconds"] == 2.0 and got["steps_per_s"] == 2.0
    assert got["unit"] == UNIT_SAMPLES and got["samples"] == 4 * 4 and got["samples_per_s"] == 8.0
    assert got["steps"] == 4 and got["warmup"] == 2 and got["batch_sizes"] == [4]
