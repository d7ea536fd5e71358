"""search/checks/classes.py: a class check on a script that cannot reproduce a run is "not checked" with
why, never a pass, and costs no trial."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.outcomes import Role, Verdict
from autotune.core.settings import SearchSettings
from autotune.pipelines import script
from autotune.search.checks import classes
from autotune.search.store import records
from autotune.search.store.records import of_result, write
from autotune.search.store.results import failed_classes
from autotune.search.store.storage import open_storage

TRAIN = """import torch
from torch.utils.data import DataLoader
{seed}
model = torch.nn.Linear(4, 1)
"""


def _script(tmp_path: Path, seed: str) -> TrialConfig:
    path = tmp_path / f"train_{abs(hash(seed))}.py"
    path.write_text(TRAIN.format(seed=seed))
    return TrialConfig(pipeline=script.spec_of(str(path)))


def test_a_script_is_reproducible_when_it_seeds_torch(tmp_path: Path) -> None:
    assert script.not_checkable(TrialConfig()) is None  # not a script
    assert (
        script.not_checkable(_script(tmp_path, "torch.manual_seed(at.seed(0))\nfrom autotune import script as at"))
        is None
    )
    assert script.not_checkable(_script(tmp_path, "torch.manual_seed(0)")) is None
    assert script.not_checkable(_script(tmp_path, "import lightning as L\nL.seed_everything(1)")) is None
    # A generator's seed orders the data, but the weights are drawn afresh in every run.
    why = script.not_checkable(_script(tmp_path, "g = torch.Generator().manual_seed(0)"))
    assert why is not None and "never seeds torch" in why


def test_an_unseeded_script_s_class_is_not_checked_and_runs_nothing(tmp_path: Path) -> None:
    base = _script(tmp_path, "")
    settings = SearchSettings(budget_s=60, storage=str(tmp_path / "s.db"), base=base, parity_steps=5)
    study = optuna.create_study(storage=open_storage(settings.storage), direction="maximize")
    for role, cfg, sps in ((Role.BASELINE, base, 10.0), (Role.SEARCH, base.replace(precision="bf16"), 15.0)):
        t = study.ask()
        write(t, of_result(role, cfg, TrialResult(status="ok", samples_per_s=sps), sps / 10.0, False))
        study.tell(t, sps)
    candidate = study.trials[1]
    folder = tmp_path / "parity"
    check = classes.run_check(study, settings, candidate, base.replace(precision="bf16"), folder, None)
    assert check["verdict"] == Verdict.NOT_CHECKED and check["reason"].startswith("not checkable: the script never")
    assert check["kind"] == "parity" and not folder.exists()  # no trial was started
    assert list(records.class_checks(study).values())[0]["verdict"] == Verdict.NOT_CHECKED
    assert "precision fp32 -> bf16" not in failed_classes(study)  # its configs are not written off
