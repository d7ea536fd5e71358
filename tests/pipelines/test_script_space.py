"""What a script's space says of the knobs its source keeps: the batch it runs when it keeps its own (read
from its DataLoader, not autotune's default), and optimizer_fusion for an optimizer without the
fused/foreach pair (fixed with the reason, not searched and recorded "in effect none")."""

from __future__ import annotations

from pathlib import Path

from autotune.core.config import TrialConfig
from autotune.pipelines import load_pipeline, script, unsupported_of
from autotune.pipelines.script import fusion
from autotune.search.space.reading import load_space
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware
from autotune.search.space.spec import Fixed
from tests.conftest import REPO_ROOT

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, cpu_bf16=True, apex=False, memory_bytes=None)
HEAD = """import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=32)
args = p.parse_args()
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = torch.nn.Linear(4, 1)
"""


def notes_for(tmp_path: Path, body: str, *args: str) -> tuple[dict[str, object], list[str]]:
    """The default space narrowed for a script `HEAD + body` run with `args`: its knobs and `space:` notes."""
    path = tmp_path / "train.py"
    path.write_text(HEAD + body)
    job = load_pipeline(TrialConfig(pipeline=script.spec_of(str(path), list(args))))
    space = load_space(str(REPO_ROOT / "search_spaces" / "default.yaml"))
    narrowed, notes = for_hardware(space, CPU, stages=0, unsupported=unsupported_of(job))
    return dict(narrowed.knobs), notes


def note(notes: list[str], knob: str) -> str:
    return next(n for n in notes if n.startswith(f"{knob} not searched"))


def test_a_script_that_keeps_its_batch_is_said_to_run_its_own_value(tmp_path: Path) -> None:
    loader = "loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)\n"
    said = note(notes_for(tmp_path, loader)[1], "batch_size")
    assert "the script runs its own batch size, 32 (its DataLoader's batch_size)" in said, said
    assert "32" in note(notes_for(tmp_path, loader, "--batch-size", "32")[1], "batch_size")
    assert ", 4 (its DataLoader" in note(notes_for(tmp_path, loader, "--batch-size", "4")[1], "batch_size")
    assert ", 1 (its DataLoader" in note(notes_for(tmp_path, "loader = DataLoader(data)\n")[1], "batch_size")
    # A batch the source cannot give: its own, with no number.
    unread = note(notes_for(tmp_path, "loader = DataLoader(data, batch_size=args.batch_size // 2)\n")[1], "batch_size")
    assert "the script runs its own batch size, not the value the config records" in unread, unread


def test_optimizer_fusion_is_fixed_for_an_optimizer_without_the_fused_foreach_pair(tmp_path: Path) -> None:
    knobs, notes = notes_for(tmp_path, "opt = torch.optim.Adadelta(model.parameters(), lr=1.0)\n")
    assert knobs["optimizer_fusion"] == Fixed("none")
    said = note(notes, "optimizer_fusion")
    assert "torch.optim.Adadelta takes foreach but not fused" in said, said
    knobs, notes = notes_for(tmp_path, "opt = torch.optim.LBFGS(model.parameters())\n")
    assert "LBFGS takes neither fused nor foreach" in note(notes, "optimizer_fusion")
    # The pair (SGD), or a class autotune cannot read (not torch.optim's): searched, the trial records it.
    for body in ("opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", "opt = Lion(model.parameters())\n"):
        knobs, notes = notes_for(tmp_path, body)
        assert not isinstance(knobs["optimizer_fusion"], Fixed), body
        assert not any(n.startswith("optimizer_fusion not searched") for n in notes)


def test_the_flags_are_read_from_the_constructor_s_signature() -> None:
    assert fusion.flags_of("AdamW") == {"fused", "foreach"}
    assert fusion.flags_of("RMSprop") == {"foreach"}
    assert fusion.flags_of("LBFGS") == frozenset()
    assert fusion.flags_of("Lion") is None and fusion.flags_of("lr_scheduler") is None
    assert fusion.unroutable(()) is None  # the source names no optimizer: searched
    assert fusion.unroutable(("SGD", "Adadelta")) is None  # one of them takes the pair
