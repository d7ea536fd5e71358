"""search/store/fleet.py: the worker that finishes a study last, and only that one, runs its confirmation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna

from autotune.search.store import fleet
from autotune.search.store.storage import open_storage


def study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(study_name="f", storage=open_storage(str(tmp_path / "studies.db")))


def test_only_the_last_running_worker_finishes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fleet, "SETTLE_S", 0.05)
    s = study(tmp_path)
    a, b = fleet.register(s), fleet.register(s)
    assert a != b and s.user_attrs[a]["state"] == "running"
    assert not fleet.finishes(s, a)  # b still runs: a leaves confirmation to it
    assert s.user_attrs[a]["state"] == "done"
    assert fleet.finishes(s, b)  # the last one


def test_a_dead_worker_does_not_hold_the_study_open(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fleet, "SETTLE_S", 0.05)
    s = study(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    s.set_user_attr(
        "worker:dead", {"host": fleet.socket.gethostname(), "pid": int(gone.stdout), "started": 0.0, "state": "running"}
    )
    me = fleet.register(s)
    assert fleet.finishes(s, me)  # the crashed worker's pid is gone: it is not waited for


def test_the_heartbeat_keeps_the_record(tmp_path: Path) -> None:
    s = study(tmp_path)
    me = fleet.register(s)
    fleet.beat(s, me)
    assert s.user_attrs[me]["state"] == "running" and s.user_attrs[me]["heartbeat"] > 0
