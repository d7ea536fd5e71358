"""A script pipeline's trial: the user's script, run as written in the trial process, measured through
torch's own hooks (optimizer steps, the loader's __next__), with the no-edit knobs put into its
DataLoader and optimizer, and the baseline running the script's own settings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.pipelines import script
from autotune.trial.loop import worker
from autotune.trial.loop.script import Seams
from autotune.trial.measurement.clock import Clock
from tests.pipelines.script_helpers import EXAMPLE, SCRIPTS, images

__all__ = ["images"]  # a fixture
HERE = Path(__file__).parent


def trial(path: Path, args: list[str], **knobs: Any) -> Any:
    knobs = {"warmup_steps": 2, "timed_steps": 4, "window": 2, "num_threads": 1, **knobs}
    return worker.run(TrialConfig(pipeline=script.spec_of(str(path), args), **knobs))


def test_the_script_s_own_loop_is_measured_with_the_knobs_in_its_loader(images: Path) -> None:
    init = torch.utils.data.DataLoader.__init__
    r = trial(EXAMPLE, [str(images), "--epochs", "10", "--size", "32"], num_workers=1, optimizer_fusion="foreach")
    a = r.applied
    assert r.status == "ok" and r.timed_steps == 4
    # The step hook's count: warm-up, the 1 worker x prefetch 2 batches made ahead drained, the timed steps.
    assert a["script"]["optimizer_steps"] == 2 + 2 + 4
    assert a["script"]["samples_per_step"] == 8  # the script's own batch size, as its loader delivered it
    assert a["num_workers"]["in_effect"] == 1 and a["script"]["loaders"][0]["num_workers"] == 1
    assert a["optimizer_fusion"]["in_effect"] == "foreach" and a["script"]["optimizers"][0]["type"] == "SGD"
    assert a["script"]["api_calls"]["autocast"] >= 6 and r.losses and all(0 < x < 2 for x in r.losses)
    assert torch.utils.data.DataLoader.__init__ is init  # torch as it was after the script


def test_the_baseline_runs_the_script_s_own_settings() -> None:
    r = trial(SCRIPTS / "own_workers.py", ["1"], num_threads=0)  # the baseline's knobs
    a = r.applied
    assert a["num_workers"] == {"requested": 0, "in_effect": 1, "why": "the baseline runs the script's own settings"}
    assert a["optimizer_fusion"]["in_effect"] == "fused"  # its own Adam(fused=True)
    r = trial(SCRIPTS / "own_workers.py", ["1"], optimizer_fusion="none")
    assert r.applied["num_workers"]["in_effect"] == 0 and r.applied["optimizer_fusion"]["in_effect"] == "none"


def test_a_script_without_a_loader_counts_optimizer_steps_and_refuses_loader_knobs() -> None:
    r = trial(SCRIPTS / "no_loader.py", ["--steps", "50"], precision="bf16")
    assert r.status == "ok" and r.applied["script"]["samples_per_step"] == 1
    assert r.applied["num_workers"]["why"].startswith("the script builds no torch DataLoader")
    assert r.applied["precision"]["in_effect"] == "bf16" and r.applied["script"]["optimizer_steps"] == 6
    with pytest.raises(TrialUnsupported, match="num_workers"):
        trial(SCRIPTS / "no_loader.py", [], num_workers=1)


def test_a_script_that_ends_before_the_timed_steps_says_so() -> None:
    from autotune.core.errors import ConfigError

    with pytest.raises(ConfigError, match="ended after 3 optimizer step"):
        trial(SCRIPTS / "no_loader.py", ["--steps", "3"])


def test_an_iterable_dataset_keeps_the_script_s_own_workers() -> None:
    """More workers over a stream that does not shard itself would train on every item once per worker."""
    r = trial(SCRIPTS / "iterable.py", [], num_workers=2)
    assert r.applied["num_workers"]["in_effect"] == 0
    assert "IterableDataset" in r.applied["num_workers"]["why"]


def test_one_seed_trains_the_same_losses_and_the_data_seed_reorders_the_data(images: Path) -> None:
    """What parity needs of a script: two runs with one seed train alike; its data-order twin does not."""
    args = [str(images), "--epochs", "10", "--size", "32"]
    a, b = (trial(EXAMPLE, args, warmup_steps=0, timed_steps=6).losses for _ in range(2))
    twin = trial(EXAMPLE, args, warmup_steps=0, timed_steps=6, data_seed=1).losses
    assert len(a) == 6 and a == b and twin != a


def test_the_batches_a_script_s_loader_made_ahead_are_consumed_before_the_clock_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As autotune's own loop does (tests/trial/loop/test_worker.py): timed, the batches the workers made
    while the first step was slow would come free and overstate a many-worker config."""
    r = trial(HERE / "scripts" / "made_ahead.py", [str(tmp_path)], num_workers=2, prefetch_factor=2)
    # Before the clock could start, the slow first step had let the workers make every batch they may make ahead.
    ahead = int((tmp_path / "by_first_step").read_text()) // 4 - 1  # batches of 4, less the first step's
    assert ahead == 2 * 2  # num_workers x prefetch_factor
    # Those are consumed by as many more warm-up steps (one batch a step), so none of them is timed.
    assert r.timed_steps == 4 and r.applied["script"]["optimizer_steps"] == len(r.losses) == 2 + ahead + 4
    assert "4 more warm-up step(s): the loader keeps 4 batches made ahead (2 workers x prefetch 2)" in (
        capsys.readouterr().err
    )


def test_a_script_s_fetch_is_timed_from_a_device_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels run asynchronously: a micro-batch fetched while the previous one's kernels still run would
    count them as a wait on the loader. The seam syncs the device (torch.cuda faked) before each fetch."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    cfg = TrialConfig(warmup_steps=1)
    seams = Seams(cfg, Clock(cfg, torch.device("cuda", 0), 0, 1, None, time.time()), as_written=True)

    def fetch(it: Any) -> torch.Tensor:
        events.append("fetch")
        return torch.zeros(4, 2)

    next_batch = seams.loader_next(fetch)
    for _ in range(2):  # the first also begins the clock (a sync of its own): the second tells
        assert next_batch(None).shape == (4, 2)
        assert events[-2:] == ["sync", "fetch"]
    assert seams.pending_samples == 8
