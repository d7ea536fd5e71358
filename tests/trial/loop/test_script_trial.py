"""A script pipeline's trial: the user's script, run as written in the trial process, measured through
torch's own hooks (optimizer steps, the loader's __next__), with the no-edit knobs put into its
DataLoader and optimizer, and the baseline running the script's own settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.pipelines import script
from autotune.trial.loop import worker
from tests.pipelines.script_helpers import EXAMPLE, SCRIPTS, images

__all__ = ["images"]  # a fixture


def trial(path: Path, args: list[str], **knobs: Any) -> Any:
    knobs = {"warmup_steps": 2, "timed_steps": 4, "window": 2, "num_threads": 1, **knobs}
    return worker.run(TrialConfig(pipeline=script.spec_of(str(path), args), **knobs))


def test_the_script_s_own_loop_is_measured_with_the_knobs_in_its_loader(images: Path) -> None:
    init = torch.utils.data.DataLoader.__init__
    r = trial(EXAMPLE, [str(images), "--epochs", "10", "--size", "32"], num_workers=1, optimizer_fusion="foreach")
    a = r.applied
    assert r.status == "ok" and r.timed_steps == 4
    assert a["script"]["optimizer_steps"] == 2 + 4  # the step hook's count: warm-up, then the timed steps
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
