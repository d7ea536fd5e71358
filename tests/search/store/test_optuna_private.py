"""autotune.search.store._optuna is the one place that touches Optuna's private API. Pin the versions it was
checked against, and exercise every helper on real storages, so an Optuna upgrade fails here first."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.search.store import _optuna
from autotune.search.store.storage import open_storage


def test_installed_optuna_is_in_the_supported_range() -> None:
    low, high = _optuna.SUPPORTED
    version = tuple(int(p) for p in optuna.__version__.split(".")[:2])
    assert low <= version < high, (
        f"optuna {optuna.__version__}: re-check autotune/search/store/_optuna.py, then widen SUPPORTED"
    )


def test_no_other_module_imports_optuna_private_names() -> None:
    root = Path(__file__).resolve().parents[3] / "autotune"
    users = [
        p.relative_to(root)
        for p in root.rglob("*.py")
        if "._" in "".join(line for line in p.read_text().splitlines() if "optuna" in line and "import" in line)
        and p.name != "_optuna.py"
    ]
    assert users == []


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_helpers_on_real_storages(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "j.db") if kind == "journal" else f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    trial = study.ask()
    assert _optuna.storage_of(study).get_trial(_optuna.trial_id(trial)).number == trial.number
    assert _optuna.heartbeats(study) is (kind == "sqlite")  # open_storage turns heartbeats on for RDB
    with _optuna.heartbeat_thread(study, trial):
        pass
    frozen = study.get_trials(deepcopy=False)[0]
    _optuna.fail_trial(study, frozen, {"reason": "stale"})
    again = optuna.load_study(study_name="s", storage=open_storage(url)).trials[0]
    assert again.state == TrialState.FAIL and again.user_attrs["reason"] == "stale"
