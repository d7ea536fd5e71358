"""A dataset item that cannot be loaded fails the trial as "data" (exit code 2, TrialDataError) with
the file or item named, rather than as a crash with a decoder's traceback: real worker processes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import Subset, TensorDataset

from autotune import cli
from autotune.core import errors
from autotune.core.config import TrialConfig
from autotune.pipelines.unet.data import make_data
from autotune.trial.loop import harness
from autotune.trial.processes import launcher
from tests.conftest import wait_until_gone

pytestmark = pytest.mark.usefixtures("repo_on_path")

BAD = "images/00002.jpg"


@pytest.fixture
def bad_folder(tmp_path: Path) -> Path:
    """Four 64x64 pairs, one image garbage: a batch of two reaches it within an epoch's two steps."""
    d = make_data(tmp_path / "data", n=4, size=(64, 64))
    (d / BAD).write_bytes(b"<html>404 not found</html>")
    return d


def unet_cfg(data: Path, **changes: Any) -> TrialConfig:
    return TrialConfig(
        image_size=64, batch_size=2, warmup_steps=1, timed_steps=2, window=1, num_threads=1, data_dir=str(data)
    ).replace(**changes)


# --- the built-in Unet: the file is named --------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
def test_unet_bad_image_is_trial_data_error_naming_the_file(bad_folder: Path, tmp_path: Path, num_workers: int) -> None:
    trial_dir = tmp_path / f"trial-{num_workers}"
    with pytest.raises(errors.TrialDataError) as e:
        launcher.run_trial(unet_cfg(bad_folder, num_workers=num_workers), trial_dir, timeout_s=300)
    msg = str(e.value)
    assert msg == f"cannot load {BAD} in data folder {bad_folder} (Unsupported image file); fix or remove it"
    assert "\n" not in msg and "Traceback" not in msg  # one line, even from a loader worker
    assert not wait_until_gone(str(trial_dir))


def test_cli_trial_on_a_bad_folder_exits_2_naming_the_file(
    bad_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg_yaml = tmp_path / "cfg.yaml"
    cfg_yaml.write_text(yaml.safe_dump(unet_cfg(bad_folder).to_dict()))
    assert cli.main(["trial", "--config", str(cfg_yaml)]) == 2
    err = capsys.readouterr().err
    assert "autotune trial: data:" in err and BAD in err and "Unsupported image file" in err
    assert len(err.strip().splitlines()) == 1  # no log tail, no traceback


# --- a user's pipeline: the item is named --------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
def test_user_dataset_error_is_trial_data_error_naming_the_item(tmp_path: Path, num_workers: int) -> None:
    cfg = TrialConfig(
        pipeline="tests.trial.data_fault_pipelines:make",
        batch_size=2,
        warmup_steps=1,
        timed_steps=2,
        window=1,
        num_workers=num_workers,
    )
    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialDataError) as e:
        launcher.run_trial(cfg, trial_dir, timeout_s=120)
    assert str(e.value) == "dataset item 3: ValueError: record 3 is corrupt: unexpected end of stream"
    # The user's own traceback is kept in the log, where their line numbers are.
    assert "raise ValueError" in (trial_dir / "trial.log").read_text()
    assert not wait_until_gone(str(trial_dir))


# --- the wrapper, in process ---------------------------------------------------------------------


class Exploding(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Any:
        raise self.exc


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        MemoryError(),
        KeyboardInterrupt(),
        errors.DataItemError("cannot load a.jpg in data folder /x (bad)", path="a.jpg"),
    ],
)
def test_wrapper_passes_through_what_is_not_an_item_failure(exc: BaseException) -> None:
    with pytest.raises(type(exc)) as e:
        harness.checked(Exploding(exc))[1]
    assert e.value is exc


def test_wrapper_is_picklable_and_transparent() -> None:
    ds = TensorDataset(torch.arange(6.0))
    wrapped = pickle.loads(pickle.dumps(harness.checked(ds)))
    assert len(wrapped) == 6 and float(wrapped[4][0]) == 4.0


def test_wrapper_keeps_batched_fetching() -> None:
    # Subset fetches a batch at once through __getitems__; the wrapper must keep that path.
    wrapped = harness.checked(Subset(TensorDataset(torch.arange(6.0)), [5, 1, 2]))
    assert isinstance(wrapped, harness.CheckedBatches)
    assert [float(x[0]) for x in wrapped.__getitems__([0, 1])] == [5.0, 1.0]  # type: ignore[attr-defined]
    with pytest.raises(errors.DataItemError, match=r"dataset items 0, 7 \(one batch\): IndexError"):
        wrapped.__getitems__([0, 7])  # type: ignore[attr-defined]


def test_data_reason_maps_to_bad_input_without_changing_exit_2() -> None:
    assert errors.exit_code_for("data") == errors.ExitCode.BAD_INPUT == 2
    assert errors.failure_class("data") is errors.TrialDataError
    assert errors.reason_for_exit(2) == "bad_config"


def test_summary_of_a_data_item_error_rebuilt_by_a_loader_worker() -> None:
    from torch.utils.data._utils import ExceptionWrapper

    try:
        raise errors.DataItemError("dataset item 3: ValueError: boom", index=3)
    except errors.DataItemError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(errors.DataItemError) as e:
        wrapped.reraise()
    assert "Original Traceback" in str(e.value) and e.value.summary == "dataset item 3: ValueError: boom"
