"""trial/loop/outcome.py: one status per cause for the worker, train and the probe, and the ranks' verdicts
read back as the one that names the cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotune.core.errors import ConfigError, DataItemError, TrialUnsupported, exit_code_for
from autotune.trial.measurement.clock import NonFiniteLoss
from autotune.trial.loop.outcome import named_failure, read_verdicts, status_of


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (ConfigError("batch_size must be >= 1"), "bad_config", 2),
        (TrialUnsupported("apex is not installed"), "unsupported", 5),
        (NonFiniteLoss("loss is nan at step 3"), "numerics", 4),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom", 3),
        (RuntimeError("something else"), "error", 1),
    ],
)
def test_each_cause_has_one_status_and_exit_code(exc: BaseException, status: str, code: int) -> None:
    got, message = status_of(exc)
    assert got == status and int(exit_code_for(got)) == code
    assert message and "\n" not in message


def test_an_undecodable_item_is_a_data_status_with_its_summary() -> None:
    e = DataItemError("item 3 (img_0003.jpg): cannot decode", path="img_0003.jpg")
    assert status_of(e) == ("data", "item 3 (img_0003.jpg): cannot decode")


def test_a_named_failure_on_any_rank_wins_over_a_peer_s_error(tmp_path: Path) -> None:
    (tmp_path / "v.rank0").write_text(json.dumps({"status": "error", "message": "connection closed"}))
    (tmp_path / "v.rank1").write_text(json.dumps({"status": "oom", "message": "out of memory"}))
    (tmp_path / "v.rank2").write_text("{torn")  # a rank killed mid-write: skipped, not fatal
    verdicts = read_verdicts(tmp_path.glob("v.rank*"))
    assert len(verdicts) == 2 and named_failure(verdicts) == {"status": "oom", "message": "out of memory"}
    assert named_failure([{"status": "ok"}]) is None
