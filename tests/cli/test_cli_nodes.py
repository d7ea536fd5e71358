"""--nodes, --launcher, --scheduler: bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.pipelines.unet.data import make_data
from autotune.trial.processes import placement
from tests.cli.test_cli import bad


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data(tmp_path_factory.mktemp("cli") / "data", n=8, size=(96, 96), seed=1)


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for key in (placement.NODES_ENV, placement.LAUNCHER_ENV, placement.SCHEDULER_ENV, placement.SCHEDULER_ARGS_ENV):
        monkeypatch.delenv(key, raising=False)  # the CLI sets them; restored after each test
    return tmp_path


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["--nodes", "0"], "--nodes must be >= 1"),
        (["--nodes", "2"], "--nodes 2 needs a launcher that spans nodes (--launcher torchx)"),
        (["--nodes", "2", "--launcher", "torchx"], "--launcher torchx needs --scheduler"),
        (["--nodes", "2", "--launcher", "torchx", "--scheduler", "nope"], "not a TorchX scheduler"),
        (["--nodes", "100000", "--launcher", "torchx", "--scheduler", "local_cwd"], "simulates each node"),
        (
            ["--nodes", "2", "--launcher", "torchx", "--scheduler", "local_cwd", "--global-batch", "8"],
            "--global-batch with --nodes 2 is not supported",
        ),
    ],
)
def test_bad_placements(capsys: pytest.CaptureFixture[str], data: Path, argv: list[str], phrase: str) -> None:
    pytest.importorskip("torchx")
    assert phrase in bad(capsys, "search", "--budget", "1m", "--data", str(data), *argv)
    assert not Path("studies").exists()  # nothing written, not even the studies folder


def test_torchx_missing(capsys: pytest.CaptureFixture[str], data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchx.schedulers", None)
    argv = ["--nodes", "2", "--launcher", "torchx", "--scheduler", "local_cwd"]
    assert "torchx is not installed" in bad(capsys, "search", "--budget", "1m", "--data", str(data), *argv)


def test_trial_and_worker_take_the_same_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("batch_size: 4\n")
    assert "--nodes 3 needs a launcher" in bad(capsys, "trial", "--config", str(config), "--nodes", "3")
    code = main(["worker", "--storage", str(tmp_path / "s.db"), "--study", "x", "--n-trials", "1", "--nodes", "0"])
    assert code == 2 and "--nodes must be >= 1" in capsys.readouterr().err
