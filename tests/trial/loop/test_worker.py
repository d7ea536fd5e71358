"""autotune/trial.py: the worker measures what it says, records every knob, and exits with a code
that names the failure (0 ok, 1 error, 2 bad config, 3 oom, 4 numerics, 5 unsupported)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.trial.loop import harness, loading

from autotune.trial.loop import worker as trial
from autotune.core.config import KNOBS, TrialConfig
from autotune.core.result import TrialResult
from autotune.core.errors import ExitCode, PipelineError, TrialUnsupported
from autotune.core.files import write_json_atomic
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.side_by_side

TINY = "tests.fault_pipelines:tiny"


def tiny_cfg(**changes: Any) -> TrialConfig:
    base = TrialConfig(pipeline=TINY, batch_size=4, warmup_steps=1, timed_steps=4, window=2)
    return base.replace(**changes)


@pytest.fixture
def inproc(repo_on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(trial.LAUNCH_TIME_ENV, raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)


# --- in-process: what one run measures and records ------------------------------------------------


def test_run_measures_and_records_every_knob(inproc: None, tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    cfg = tiny_cfg(timed_steps=6, window=2)
    r = trial.run(cfg, progress=progress)
    assert r.status == "ok" and r.timed_steps == 6 and r.world_size == 1 and r.device == "cpu"
    assert set(KNOBS) <= set(r.applied), f"not recorded: {set(KNOBS) - set(r.applied)}"
    for k in KNOBS:
        assert r.applied[k]["requested"] == getattr(cfg, k), k
    assert len(r.windows) == 3 and all(w > 0 and math.isfinite(w) for w in r.windows)
    assert r.samples_per_s is not None and r.samples_per_s > 0
    assert 0 <= r.data_wait_fraction <= 1
    assert 0 < r.step_time_p50 <= r.step_time_p90
    assert r.loss_finite and r.startup_s > 0 and r.peak_memory_bytes > 0 and r.gpu_util is None
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4, 6]
    assert [x["samples_per_s"] for x in lines] == list(r.windows)


def test_applied_records_what_was_requested(inproc: None) -> None:
    cfg = tiny_cfg(
        num_workers=1,
        persistent_workers=True,
        prefetch_factor=3,
        pin_memory=True,
        batch_size=2,
        precision="bf16",
        optimizer_fusion="foreach",
        checkpoint_segments=1,
        channels_last=True,
        cudnn_benchmark=True,
        set_to_none=False,
        num_threads=1,
        timed_steps=2,
        window=1,
    )
    r = trial.run(cfg)
    for k in KNOBS:
        assert r.applied[k]["requested"] == getattr(cfg, k), k
    assert r.applied["checkpoint_segments"]["in_effect"] == ["0"]
    assert r.applied["pin_memory"]["in_effect"] is False and r.applied["pin_memory"]["why"]
    assert r.applied["precision"]["in_effect"] == "bf16" and "autocast(cpu, bf16)" in r.applied["precision"]["why"]
    assert r.applied["num_threads"]["in_effect"] == 1


@pytest.mark.parametrize("set_to_none", [True, False])
def test_set_to_none_reaches_zero_grad(inproc: None, monkeypatch: pytest.MonkeyPatch, set_to_none: bool) -> None:
    calls: list[bool] = []
    original = torch.optim.Optimizer.zero_grad

    def spy(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        calls.append(set_to_none)
        original(self, set_to_none=set_to_none)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", spy)
    r = trial.run(tiny_cfg(set_to_none=set_to_none, warmup_steps=1, timed_steps=2))
    assert calls == [set_to_none] * 3  # once per step, warm-up included
    assert r.applied["set_to_none"] == {"requested": set_to_none, "in_effect": set_to_none}


def test_time_boxed_run(inproc: None) -> None:
    r = trial.run(tiny_cfg(seconds=0.3, timed_steps=1, window=2))
    assert r.timed_steps >= 2  # at least one window, whatever the clock says
    assert len(r.windows) == r.timed_steps // 2


def test_launch_time_counts_towards_startup(inproc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv(trial.LAUNCH_TIME_ENV, repr(time.time() - 100))
    assert trial.run(tiny_cfg(timed_steps=2)).startup_s >= 100


def test_pipeline_may_refuse_a_knob(inproc: None) -> None:
    with pytest.raises(TrialUnsupported, match="channels_last"):
        trial.run(tiny_cfg(pipeline="tests.fault_pipelines:no_channels_last", channels_last=True))
    # left at its default, the knob is no reason to refuse
    assert trial.run(tiny_cfg(pipeline="tests.fault_pipelines:no_channels_last", timed_steps=2)).status == "ok"


def test_not_a_pipeline(inproc: None) -> None:
    with pytest.raises(PipelineError, match="build_model"):
        trial.run(tiny_cfg(pipeline="tests.fault_pipelines:not_a_pipeline"))


def test_batches_go_on_past_one_epoch_and_reshuffle() -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader, _ = loading.build_loader(ds, TrialConfig(batch_size=4), 0, 1, torch.device("cpu"))
    stream = harness.batches(loader)
    got = [next(stream)[0] for _ in range(6)]  # three epochs of two batches
    assert all(b.shape == (4,) for b in got)
    for epoch in range(3):
        assert sorted(torch.cat(got[2 * epoch : 2 * epoch + 2]).tolist()) == list(range(8))


def test_write_json_atomic(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "result.json"
    write_json_atomic(out, {"a": 1, "p": Path("/x")})
    assert json.loads(out.read_text()) == {"a": 1, "p": "/x"}
    assert [p.name for p in out.parent.iterdir()] == ["result.json"]  # no temporary left behind


# --- the Unet really learns -----------------------------------------------------------------------


@pytest.mark.usefixtures("one_thread")
def test_unet_loss_falls(tiny_data: Path) -> None:
    from autotune.search.space.machine import cpu_bf16_native

    # bf16 autocast where this CPU has bf16 kernels; emulated (AVX2 only) it took 230 s instead of ~10 s,
    # and the tiny-model tests cover the autocast path there.
    precision = "bf16" if cpu_bf16_native() else "fp32"
    cfg = TrialConfig(data_dir=str(tiny_data), image_size=64, batch_size=4, lr=1e-3, precision=precision)
    h = harness.build(cfg)  # the product's own step: knobs, autocast, scaler, zero_grad
    stream = h.batches()
    losses = [h.step(next(stream)) for _ in range(30)]  # a little over five epochs of the 22 training images
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert all(math.isfinite(v) for v in losses)
    assert last < first, losses


# --- as a process: exit codes and result.json -----------------------------------------------------

WORKLOAD = {"pipeline": TINY, "batch_size": 4, "warmup_steps": 1, "timed_steps": 4, "window": 2}
CASES: dict[str, tuple[Any, int, str, list[str]]] = {
    # name: (config file contents, exit code, result.json status, what its message names)
    "ok": (WORKLOAD, ExitCode.OK, "ok", []),
    "unknown_key": ({**WORKLOAD, "batch_sise": 4}, ExitCode.BAD_INPUT, "bad_config", ["batch_sise"]),
    "bad_value": ({**WORKLOAD, "precision": "fp8"}, ExitCode.BAD_INPUT, "bad_config", ["precision", "fp8"]),
    "bad_type": ({**WORKLOAD, "batch_size": "four"}, ExitCode.BAD_INPUT, "bad_config", ["batch_size"]),
    "bad_yaml": ("pipeline: [unclosed\n", ExitCode.BAD_INPUT, "bad_config", ["not valid YAML"]),
    "no_data": (
        {"pipeline": "unet", "data_dir": "/nonexistent/autotune-data"},
        ExitCode.BAD_INPUT,
        "bad_config",
        ["/nonexistent/autotune-data"],
    ),
    "no_module": (
        {**WORKLOAD, "pipeline": "tests.no_such_module:make"},
        ExitCode.BAD_INPUT,
        "bad_config",
        ["tests.no_such_module"],
    ),
    "oom": ({**WORKLOAD, "pipeline": "tests.fault_pipelines:oom"}, ExitCode.OOM, "oom", ["out of memory"]),
    "nan": ({**WORKLOAD, "pipeline": "tests.fault_pipelines:nan"}, ExitCode.NUMERICS, "numerics", ["nan"]),
    "apex": ({**WORKLOAD, "optimizer_fusion": "apex"}, ExitCode.UNSUPPORTED, "unsupported", ["apex", "not installed"]),
    "bug": (
        {**WORKLOAD, "pipeline": "tests.fault_pipelines:broken"},
        ExitCode.ERROR,
        "error",
        ["RuntimeError", "user's model code"],
    ),
}
Run = tuple[int, str, dict[str, Any]]  # exit code, stdout and stderr together, result.json


def run_every_case(root: Path) -> dict[str, Run]:
    """Every case of CASES as its own `python -m autotune.trial`, started together to share the start-up cost."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop(trial.LAUNCH_TIME_ENV, None)
    procs = {}
    try:
        for name, (content, *_) in CASES.items():
            d = root / name
            d.mkdir()
            config = d / ("config.yaml" if isinstance(content, str) else "config.json")
            config.write_text(content if isinstance(content, str) else json.dumps(content))
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "autotune.trial", "--config", str(config), "--out", str(d / "result.json")],
                cwd=d,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        runs = {}
        for name, proc in procs.items():
            err, _ = proc.communicate(timeout=180)  # stdout and stderr together, as in a trial log
            result = root / name / "result.json"
            runs[name] = (proc.returncode, err, json.loads(result.read_text()) if result.exists() else {})
        return runs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def check_case(name: str, run: Run) -> None:
    code, err, result = run
    _, want_code, want_status, says = CASES[name]
    assert code == want_code, err
    assert result.get("status") == want_status, (result, err)
    if want_status != "ok":
        assert result["message"] and f"autotune trial: {want_status}: " in err.strip().splitlines()[-1]
        for w in says:  # the message says what went wrong
            assert w in result["message"], result["message"]
    if want_code == ExitCode.BAD_INPUT:
        assert "Traceback" not in err, err  # bad input is one line, not a stack
    if want_status == "ok":  # a full trial result
        r = TrialResult.from_dict(result)
        assert r.timed_steps == 4 and len(r.windows) == 2 and r.samples_per_s > 0 and result["loss_finite"]
        assert set(KNOBS) <= set(r.applied)
        assert "samples/s" in err


@pytest.mark.slow
def test_each_worker_case_exits_with_its_code_status_and_message(tmp_path: Path) -> None:
    """One test for all the cases, so that their processes start together once (a module fixture read by
    several tests runs again in each xdist worker that draws one of them); every case is checked, and
    every failing one reported."""
    runs = run_every_case(tmp_path)
    failed = []
    for name, run in runs.items():
        try:
            check_case(name, run)
        except AssertionError as e:
            failed.append(f"{name}: {e}")
    assert not failed, "\n\n".join(failed)


# --- the batches the loader made ahead are consumed before the clock starts


def test_the_batches_the_loader_made_ahead_are_consumed_before_the_clock_starts(
    inproc: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.trial.loader_pipelines import MADE_ENV

    monkeypatch.setenv(MADE_ENV, str(tmp_path))
    cfg = tiny_cfg(pipeline="tests.trial.loader_pipelines:made_ahead", num_workers=2, prefetch_factor=2, timed_steps=3)
    r = trial.run(cfg)
    # Before the clock could start, the slow first step had let the workers make every batch they may make ahead.
    ahead = int((tmp_path / "by_first_step").read_text()) // cfg.batch_size - cfg.warmup_steps
    assert ahead == 2 * 2  # num_workers x prefetch_factor
    # Those are consumed by as many more warm-up steps, so none of them is timed; the window is as asked.
    assert r.timed_steps == 3 and len(r.losses) == cfg.warmup_steps + ahead + 3
    assert "4 more warm-up step(s): the loader keeps 4 batches made ahead (2 workers x prefetch 2)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "changes, drained",
    [
        (dict(batch_size=2, global_batch=4), 2),  # 2 batches a step: 4 made ahead take 2 steps
        (dict(warmup_steps=0), 0),  # parity's runs: exactly their steps, a loss for each
        (dict(num_workers=0, prefetch_factor=None), 0),  # nothing made ahead
    ],
)
def test_the_drained_steps_follow_the_loader(inproc: None, changes: dict[str, Any], drained: int) -> None:
    r = trial.run(tiny_cfg(**{"num_workers": 2, "prefetch_factor": 2, "timed_steps": 3, **changes}))
    assert r.timed_steps == 3
    assert len(r.losses) == 3 + changes.get("warmup_steps", 1) + drained
