"""pipelines/script/modules.py: a script that builds its optimizer and DataLoader in modules beside it (as
llama2.c does: AdamW in model.py, its DataLoader in tinystories.py) routes them as if it built them itself:
the lr rule follows that AdamW, and the loader knobs are the script's to take."""

from __future__ import annotations

from pathlib import Path

from autotune.core.config import TrialConfig
from autotune.pipelines import load_pipeline
from autotune.pipelines.script import lr_rule, scan_script, spec_of
from autotune.pipelines.script.modules import local_modules

TRAIN = """import torch
import model
from data.loading import batches
from model import build  # the same module again

opt = build(torch.nn.Linear(2, 2))
for x in batches():
    opt.step()
"""
MODEL = """import torch
import train  # a cycle back to the script: not followed twice


def build(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-3)
"""
LOADING = """from torch.utils.data import DataLoader


def batches():
    return DataLoader([1, 2, 3], batch_size=1)
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("")
    (tmp_path / "data" / "loading.py").write_text(LOADING)
    (tmp_path / "broken.py").write_text("def (:\n")  # never imported: never read
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return script


def test_the_modules_a_script_imports_from_its_folder_are_followed(tmp_path: Path) -> None:
    import ast

    script = _project(tmp_path)
    found = [path.relative_to(tmp_path).as_posix() for path, _ in local_modules(script, ast.parse(TRAIN))]
    assert sorted(found) == ["data/__init__.py", "data/loading.py", "model.py"]  # not torch, not train.py


def test_an_optimizer_and_a_loader_built_in_modules_are_the_script_s(tmp_path: Path) -> None:
    script = _project(tmp_path)
    uses = scan_script(str(script))
    assert uses.dataloader and uses.optimizers == ("AdamW",)
    assert lr_rule(uses)[0] == "sqrt" and "AdamW" in lr_rule(uses)[1]
    job = load_pipeline(TrialConfig(pipeline=spec_of(str(script), [])))
    assert "num_workers" not in job.unsupported and "optimizer_fusion" not in job.unsupported
    # The script alone, its modules gone: nothing routed, and said so.
    (tmp_path / "model.py").unlink()
    (tmp_path / "data" / "loading.py").unlink()
    alone = scan_script(str(script))
    assert not alone.dataloader and alone.optimizers == ()
    assert "no optimizer autotune knows" in lr_rule(alone)[1]
