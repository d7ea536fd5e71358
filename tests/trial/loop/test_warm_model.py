"""autotune/trial/loop/warm_model.py: a model drawn once by a warm server's builder is, to the trial that takes
it, the model its own build would have drawn, bit for bit, with every generator left where that build
would have left it; any trial it is not the same for builds its own."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import autotune.pipelines.unet.pipeline  # noqa: F401 - the server has imported it: wanted() looks there
from autotune import pipelines
from autotune.core.config import TrialConfig
from autotune.core.files import write_json_atomic
from autotune.trial.processes import launcher
from autotune.trial.loop import warm_model
from autotune.trial.loop.warm_model import seeded_pipeline
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer
from autotune.trial.loop.worker import LAUNCH_TIME_ENV
from tests.fakes import fault_cfg
from tests.fault_pipelines import TinyPipeline

pytestmark = pytest.mark.usefixtures("repo_on_path")

HERE = "tests.trial.loop.test_warm_model"


class KeyedTiny(TinyPipeline):
    """The tiny net, declared the same for every config."""

    def model_key(self) -> tuple[()]:
        return ()


class KeyFails(TinyPipeline):
    """Declares a key it cannot give: the server's builder fails."""

    def model_key(self) -> tuple[()]:
        raise RuntimeError("no key today")


class DrawsFromNumpy(KeyedTiny):
    """Its build also draws from numpy's global generator, as some model code does."""

    def build_model(self) -> nn.Module:
        model = super().build_model()
        with torch.no_grad():
            model[0].bias.copy_(torch.from_numpy(np.random.standard_normal(8).astype(np.float32)))
        return model


@pytest.fixture
def no_prebuilt(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[warm_model.Prebuilt]]:
    prebuilt: list[warm_model.Prebuilt] = []
    monkeypatch.setattr(warm_model, "PREBUILT", prebuilt)
    yield prebuilt


def argv_for(cfg: TrialConfig, folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "config.json", cfg.to_dict())
    return launcher.command(cfg, folder)[3:]  # what follows `python -m autotune.trial`


def prebuild(cfg: TrialConfig, folder: Path) -> None:
    """What the server's builder does for a request of `cfg`, then the server's load of its file."""
    out = str(folder / "model.pt")
    assert warm_model.build_entry(argv_for(cfg, folder), out) == 0
    warm_model.load(out)


def drawn(cfg: TrialConfig) -> tuple[nn.Module, torch.Tensor, float]:
    """The model a trial of `cfg` starts from, the generator state after it, and the next draw."""
    model = warm_model.build_model(seeded_pipeline(cfg, 0), cfg)
    state = torch.get_rng_state()
    return model, state, torch.rand(()).item()


def cold(cfg: TrialConfig) -> tuple[nn.Module, torch.Tensor, float]:
    model = seeded_pipeline(cfg, 0).build_model()
    state = torch.get_rng_state()
    return model, state, torch.rand(()).item()


def assert_identical(a: nn.Module, b: nn.Module) -> None:
    assert type(a) is type(b)
    for kind in ("named_parameters", "named_buffers"):
        got, want = dict(getattr(a, kind)()), dict(getattr(b, kind)())
        assert list(got) == list(want), kind
        for name, t in want.items():
            assert got[name].dtype == t.dtype and got[name].requires_grad == t.requires_grad, name
            assert torch.equal(got[name], t), f"{kind} {name} differs"


def test_a_prebuilt_unet_is_its_cold_build_bit_for_bit(
    no_prebuilt: list[warm_model.Prebuilt], tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TrialConfig(pipeline="unet", data_dir=str(tiny_data), image_size=64, seed=3)
    prebuild(cfg, tmp_path)
    assert len(no_prebuilt) == 1
    model, state, next_draw = drawn(cfg.replace(batch_size=4, num_workers=1))  # knobs don't reach the model
    assert no_prebuilt == []  # taken, not drawn
    assert warm_model.REUSED in capsys.readouterr().out
    want_model, want_state, want_next = cold(cfg)
    assert_identical(model, want_model)
    assert torch.equal(state, want_state) and next_draw == want_next


def test_a_model_is_taken_once_per_process(no_prebuilt: list[warm_model.Prebuilt], tmp_path: Path) -> None:
    cfg = TrialConfig(pipeline=f"{HERE}:KeyedTiny")
    prebuild(cfg, tmp_path)
    first, _, _ = drawn(cfg)
    second, state, next_draw = drawn(cfg)  # the first is being trained in place: this one is drawn
    assert second is not first and no_prebuilt == []
    want_model, want_state, want_next = cold(cfg)
    assert_identical(second, want_model)
    assert torch.equal(state, want_state) and next_draw == want_next


@pytest.mark.parametrize(
    "change",
    [{"seed": 1}, {"pipeline": "tests.fault_pipelines:tiny"}, {"pipeline": f"{HERE}:DrawsFromNumpy"}],
    ids=["seed", "undeclared-pipeline", "other-pipeline"],
)
def test_a_trial_it_is_not_the_same_for_draws_its_own(
    no_prebuilt: list[warm_model.Prebuilt], tmp_path: Path, change: dict[str, Any]
) -> None:
    cfg = TrialConfig(pipeline=f"{HERE}:KeyedTiny")
    prebuild(cfg, tmp_path)
    other = cfg.replace(**change)
    np.random.seed(0)
    model, state, next_draw = drawn(other)
    assert len(no_prebuilt) == 1  # still there, untouched
    np.random.seed(0)
    want_model, want_state, want_next = cold(other)
    assert_identical(model, want_model)
    assert torch.equal(state, want_state) and next_draw == want_next


def test_a_key_that_differs_is_none_or_fails_draws_its_own(
    no_prebuilt: list[warm_model.Prebuilt], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = TrialConfig(pipeline=f"{HERE}:KeyedTiny")
    prebuild(cfg, tmp_path)
    for key in ("another", None):
        monkeypatch.setattr(KeyedTiny, "model_key", lambda self, key=key: key)
        drawn(cfg)
        assert len(no_prebuilt) == 1
    monkeypatch.setattr(KeyedTiny, "model_key", KeyFails.model_key)
    model, state, next_draw = drawn(cfg)  # a cold trial never asks for the key: its failure only means "draw"
    assert len(no_prebuilt) == 1
    want_model, want_state, want_next = cold(cfg)
    assert_identical(model, want_model)
    assert torch.equal(state, want_state) and next_draw == want_next


def test_a_build_that_draws_from_numpy_matches_its_state_and_leaves_it_as_a_cold_build(
    no_prebuilt: list[warm_model.Prebuilt], tmp_path: Path
) -> None:
    cfg = TrialConfig(pipeline=f"{HERE}:DrawsFromNumpy")
    np.random.seed(7)
    prebuild(cfg, tmp_path)
    np.random.seed(8)  # another numpy state: not the build's
    drawn(cfg)
    assert len(no_prebuilt) == 1
    np.random.seed(7)
    model, _, _ = drawn(cfg)
    assert no_prebuilt == []
    after = np.random.get_state()
    np.random.seed(7)
    want_model, _, _ = cold(cfg)
    assert_identical(model, want_model)
    assert warm_model._same_numpy_state(after, np.random.get_state())


def test_python_and_numpy_states_are_not_matched_when_the_build_does_not_draw_from_them(
    no_prebuilt: list[warm_model.Prebuilt], tmp_path: Path
) -> None:
    cfg = TrialConfig(pipeline=f"{HERE}:KeyedTiny")
    prebuild(cfg, tmp_path)
    assert no_prebuilt[0].numpy is None and no_prebuilt[0].python is None
    random.seed(123)
    np.random.seed(123)  # a forked child reseeds both from the OS: they must not stop the match
    drawn(cfg)
    assert no_prebuilt == []


def test_the_server_asks_for_a_model_only_where_the_pipeline_class_declares_its_key(
    tmp_path: Path, tiny_data: Path
) -> None:
    unet = TrialConfig(pipeline="unet", data_dir=str(tiny_data), seed=5)
    assert warm_model.wanted(argv_for(unet, tmp_path / "a"), {}) == ("unet", 5, 0)
    assert warm_model.wanted(argv_for(unet, tmp_path / "b"), {"RANK": "1"}) == ("unet", 5, 1)
    for spec in ("tests.fault_pipelines:tiny", "lightning:tests.lightning_jobs:tiny", "script:train.py"):
        assert warm_model.wanted(argv_for(unet.replace(pipeline=spec), tmp_path / "c"), {}) is None
    assert warm_model.wanted(["--config", str(tmp_path / "missing.json")], {}) is None
    assert warm_model.wanted(["--out", "x"], {}) is None


def test_a_builder_for_a_pipeline_without_a_key_saves_nothing(tmp_path: Path) -> None:
    cfg = TrialConfig(pipeline="tests.fault_pipelines:tiny")
    out = tmp_path / "model.pt"
    assert warm_model.build_entry(argv_for(cfg, tmp_path), str(out)) == warm_model.NOT_REUSABLE
    assert not out.exists()


def test_encoder_weights_to_load_are_not_drawn(tiny_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = seeded_pipeline(TrialConfig(pipeline="unet", data_dir=str(tiny_data)), 0)
    assert warm_model.model_key(pipeline) == ()
    monkeypatch.setenv("AUTOTUNE_ENCODER_WEIGHTS", "/some/encoder.pt")
    assert warm_model.model_key(pipeline) is None


# --- through a warm server ------------------------------------------------------------------------

WARM_PRELOAD = (*DEFAULT_PRELOAD, *pipelines.preload_modules("unet"), HERE)  # this module's pipelines too


def run_warm(server: WarmServer, cfg: TrialConfig, folder: Path) -> dict[str, Any]:
    env = {**os.environ, LAUNCH_TIME_ENV: repr(time.time()), "PYTHONUNBUFFERED": "1"}
    p = server.spawn(argv_for(cfg, folder), env, os.getcwd(), folder / "trial.log")
    assert p.wait(timeout=180) == 0, (folder / "trial.log").read_text()
    result: dict[str, Any] = json.loads((folder / "result.json").read_text())
    return result


@pytest.mark.slow
@pytest.mark.side_by_side
def test_warm_unet_trials_start_from_one_drawn_model_with_a_cold_trials_losses(
    server: WarmServer, tiny_config: TrialConfig, tmp_path: Path
) -> None:
    cfg = tiny_config.replace(warmup_steps=1, timed_steps=2)
    launcher.run_trial(cfg, tmp_path / "cold", timeout_s=300)
    cold_result = json.loads((tmp_path / "cold" / "result.json").read_text())
    warm = [run_warm(server, cfg, tmp_path / f"warm{i}") for i in range(2)]
    for i, result in enumerate(warm):
        assert warm_model.REUSED in (tmp_path / f"warm{i}" / "trial.log").read_text()
        assert result["losses"][0] == cold_result["losses"][0]  # the same weights on the same first batch
        assert result["losses"] == cold_result["losses"]
    assert (server.log_path.read_text().count("model drawn")) == 1  # once, for both


@pytest.mark.slow
@pytest.mark.side_by_side
def test_a_failed_builder_leaves_each_trial_its_own_build(server: WarmServer, tmp_path: Path) -> None:
    result = run_warm(server, fault_cfg("KeyFails", module=HERE), tmp_path)
    assert result["status"] == "ok"
    assert warm_model.REUSED not in (tmp_path / "trial.log").read_text()
    assert "no model (builder exit 1" in server.log_path.read_text()
    assert any("no key today" in log.read_text() for log in server.log_path.parent.glob("model-*.pt.log"))
