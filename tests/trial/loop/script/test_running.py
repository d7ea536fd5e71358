"""A script pipeline's trial: the user's script, run as written in the trial process, measured through
torch's own hooks (optimizer steps, the loader's __next__), with the no-edit knobs put into its
DataLoader and optimizer, and the baseline running the script's own settings."""

from __future__ import annotations

import math
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.core.config import TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.pipelines import script
from autotune.trial.loop import worker
from autotune.trial.loop.script.seams import Seams
from autotune.trial.measurement.clock import Clock
from tests.fakes import FakeGpu, FakeNvml
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


def test_a_script_without_a_loader_counts_what_its_model_was_fed_and_refuses_loader_knobs() -> None:
    r = trial(SCRIPTS / "no_loader.py", ["--steps", "50"], precision="bf16")
    assert r.status == "ok" and r.applied["script"]["samples_per_step"] == 16  # 8 a call, 2 micro-batches
    assert r.applied["num_workers"]["why"] == "the script built no DataLoader in this run"  # what ran, not a guess
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
    r = trial(HERE / "scripts" / "made_ahead.py", [str(tmp_path)], batch_size=4, num_workers=2, prefetch_factor=2)
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
    gpu = torch.device("cuda", 0)  # the machine's: the script showed no tensor of its own yet
    seams = Seams(cfg, lambda device: Clock(cfg, device, 0, 1, None, time.time()), as_written=True, machine=gpu)

    def fetch(it: Any) -> torch.Tensor:
        events.append("fetch")
        return torch.zeros(4, 2)

    next_batch = seams.loader_next(fetch)
    for _ in range(2):  # the first also begins the clock (a sync of its own): the second tells
        assert next_batch(None).shape == (4, 2)
        assert events[-2:] == ["sync", "fetch"]
    assert seams.pending_samples == 8


# --- where the script runs, and what it ran: observed, not the config's echo (issue 42) ------------------

AMP = HERE / "scripts" / "amp.py"


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that has a GPU (torch.cuda faked: this one has none), for a script that keeps its model on
    the CPU anyway."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    props = types.SimpleNamespace(total_memory=80 * 2**30, uuid="GPU-fake")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu("GPU-fake")], init_fails=True))
    # An optimizer's step asks the accelerator's stream whether a CUDA graph is being captured.
    monkeypatch.setattr(
        torch.accelerator, "current_stream", lambda device=None: types.SimpleNamespace(is_capturing=lambda: False)
    )


@pytest.mark.usefixtures("gpu_machine")
def test_a_script_that_keeps_its_model_on_the_cpu_records_the_cpu_not_the_machine_s_gpu() -> None:
    """Defect 1: the trial took its device from the machine, so at.autocast() entered autocast('cuda')
    around CPU ops (a no-op) and the result named the GPU and claimed bf16 from the config."""
    r = trial(AMP, [], precision="bf16")
    a = r.applied
    assert r.device == "cpu" and a["script"]["device"] == "cpu" and a["observed"]["param_device"] == "cpu"
    assert a["script"]["autocast"] == {"bf16 on cpu": 2 + 4}  # each step's at.autocast(), on the model's device
    assert a["observed"]["first_layer_output_dtype"] == "bfloat16"  # CPU autocast, where the model is
    assert a["precision"]["in_effect"] == "bf16" and "returned bfloat16" in a["precision"]["why"]


def test_precision_in_effect_is_what_the_model_ran_at() -> None:
    r = trial(AMP, [], precision="bf16")
    assert r.applied["observed"]["output_dtype"] == "bfloat16" and r.applied["precision"]["in_effect"] == "bf16"
    r = trial(AMP, [], precision="fp32")
    assert r.applied["observed"]["output_dtype"] == "float32" and r.applied["precision"]["in_effect"] == "fp32"


def test_the_baseline_runs_the_script_s_own_amp_and_another_trial_runs_its_own_precision() -> None:
    """Defect 4: at.autocast() took no "own": a script that ran bf16 AMP before the edit ran fp32 as trial 0.
    Its own precision is at.autocast()'s argument, what the call does outside a trial and in the baseline."""
    base = trial(AMP, ["--own", "bf16"], num_threads=0)  # the baseline's knobs: the script as written
    a = base.applied
    assert a["observed"]["output_dtype"] == "bfloat16" and a["precision"]["in_effect"] == "bf16"
    assert "at.autocast('bf16')" in a["precision"]["why"] and "baseline" in a["precision"]["why"]
    r = trial(AMP, ["--own", "bf16"], precision="fp32")  # another trial: the config's precision
    assert r.applied["observed"]["output_dtype"] == "float32" and r.applied["precision"]["in_effect"] == "fp32"


def test_a_script_s_own_outer_autocast_is_recorded_and_no_fp32_trial_runs_bf16_unsaid() -> None:
    """Defect 4: a script that keeps its own autocast around at.autocast() ran bf16 in an "fp32" trial,
    unrecorded. It is seen at at.autocast()'s entry: the trial's precision runs inside it, and it is said."""
    r = trial(AMP, ["--outer"], precision="fp32")
    a = r.applied
    assert a["script"]["outer_autocast"] == {"device_type": "cpu", "dtype": "bfloat16"}
    assert a["observed"]["output_dtype"] == "float32" and a["precision"]["in_effect"] == "fp32"
    assert "encloses at.autocast()" in a["precision"]["why"]
    base = trial(AMP, ["--outer"], num_threads=0)  # the baseline keeps it: the script as it runs alone
    assert base.applied["precision"]["in_effect"] == "bf16" and "keeps it" in base.applied["precision"]["why"]


@pytest.mark.parametrize(("built", "asked"), [(["--fused"], "foreach"), (["--fused"], "none"), ([], "fused")])
def test_fusion_is_switched_before_grad_scaler_picks_its_path(built: list[str], asked: str) -> None:
    """Defect 5: the fused/foreach flags were switched in the step pre-hook, after GradScaler.step had chosen
    the fused path (it hands a fused step its scale): a foreach or for-loop step then raised "Expected
    grad_scale and found_inf to be None". A GradScaler in the path (bf16 on CPU, as for fp16 on a GPU)."""
    r = trial(AMP, [*built, "--scaler", "own"], precision="bf16", optimizer_fusion=asked)
    a = r.applied
    assert r.status == "ok" and a["optimizer_fusion"]["in_effect"] == asked
    assert a["observed"]["optimizer_fused"] is (asked == "fused")
    assert a["observed"]["optimizer_foreach"] is (asked == "foreach")
    assert r.losses and all(math.isfinite(x) for x in r.losses)


def test_the_backward_seam_holds_a_copy_of_the_loss_not_the_script_s_tensor() -> None:
    """Defect 7: the seam kept the script's loss tensor (detached: the same storage) until the step ended;
    under CUDA graphs that storage is the graph's, rewritten by the next replay. It keeps a copy."""
    cfg = TrialConfig()
    seams = Seams(cfg, lambda device: Clock(cfg, device, 0, 1, None, time.time()), as_written=True)
    loss = torch.tensor(2.0, requires_grad=True) * 1.5
    seams.backward(lambda tensor, *a, **k: None)(loss)
    with torch.no_grad():
        loss.fill_(99.0)  # what a replay does to a graph's static output
    assert seams.step_loss() == 3.0


def test_compile_in_effect_is_a_compiled_model_that_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile's in_effect was the config's echo: a script that keeps running the module it passed to
    at.model() (not the compiled one returned) ran eagerly and was recorded compiled. dynamo's eager
    backend: its graphs, without inductor's code generation."""
    from autotune.trial.loop.knobs import COMPILE_BACKEND_ENV

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    r = trial(AMP, [], compile="default")
    assert r.applied["compile"]["in_effect"] == "default" and r.applied["observed"]["compiled_graphs"] >= 1
    r = trial(AMP, ["--discard"], compile="default")
    assert r.applied["compile"]["in_effect"] == "off" and r.applied["observed"]["compiled_graphs"] == 0
