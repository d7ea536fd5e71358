"""autotune/launcher.py: a trial becomes an isolated process group with a timeout; every way it can
end comes back as a TrialResult or as the TrialFailure that names it, and nothing is left running."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import pytest

from autotune.core import errors

from autotune.trial.processes import launcher
from autotune.core.config import KNOBS, TrialConfig
from autotune.core.result import TrialResult
from tests.conftest import all_gone, live_processes, wait_until_gone
from tests.fakes import fault_cfg
from tests.fault_pipelines import WATCHDOG_LINE

pytestmark = [pytest.mark.usefixtures("repo_on_path"), pytest.mark.side_by_side]


def assert_nothing_left(trial_dir: Path, pids: Sequence[int] = ()) -> None:
    left = wait_until_gone(str(trial_dir))
    assert not left, [(p.pid, p.info.get("cmdline")) for p in left]
    alive = all_gone(list(pids))
    assert not alive, f"pids {alive} still alive"


# --- the command ----------------------------------------------------------------------------------


def test_command_single_process(tmp_path: Path) -> None:
    cmd = launcher.command(TrialConfig(), tmp_path)
    assert cmd[:3] == [sys.executable, "-m", "autotune.trial"]
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "config.json")
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "result.json")


def test_command_torchrun_for_several_gpus(tmp_path: Path) -> None:
    cmd = launcher.command(TrialConfig(gpus=2), tmp_path)
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    assert cmd[5] == "2" and cmd[6:8] == ["-m", "autotune.trial"]


# --- classifying an exit (no process needed) ------------------------------------------------------


def write(trial_dir: Path, name: str, data: dict[str, Any]) -> None:
    (trial_dir / name).write_text(json.dumps(data))


def test_classify_ok(tmp_path: Path) -> None:
    write(tmp_path, "result.json", TrialResult(status="ok", samples_per_s=5.0).to_dict())
    assert launcher._classify(0, tmp_path, tmp_path / "trial.log", []).samples_per_s == 5.0


@pytest.mark.parametrize(
    "code, exc",
    [
        (3, errors.TrialOOM),
        (4, errors.TrialNumerics),
        (5, errors.TrialUnsupported),
        (2, errors.TrialBadConfig),
        (1, errors.TrialCrashed),
        (0, errors.TrialCrashed),  # 0 without a result
    ],
)
def test_classify_by_exit_code_without_a_result(tmp_path: Path, code: int, exc: type[Exception]) -> None:
    (tmp_path / "trial.log").write_text("line 1\nlast words\n")
    with pytest.raises(exc) as info:
        launcher._classify(code, tmp_path, tmp_path / "trial.log", [1.0])
    assert f"code {code}" in str(info.value)
    assert "last words" in info.value.log_tail and info.value.partial == {"windows": [1.0]}


def test_classify_a_signal(tmp_path: Path) -> None:
    with pytest.raises(errors.TrialCrashed, match="signal SIGKILL"):
        launcher._classify(-9, tmp_path, tmp_path / "trial.log", [])


def test_classify_prefers_a_named_failure_on_any_rank(tmp_path: Path) -> None:
    # Rank 1 ran out of memory; rank 0 only saw its peer vanish. The OOM is the verdict.
    write(tmp_path, "result.json", {"status": "error", "message": "RuntimeError: Connection closed by peer"})
    write(tmp_path, "result.json.rank1", {"status": "oom", "message": "CUDA out of memory"})
    with pytest.raises(errors.TrialOOM, match="out of memory"):
        launcher._classify(1, tmp_path, tmp_path / "trial.log", [])


def test_classify_an_nccl_watchdog_abort_as_a_communication_failure(tmp_path: Path) -> None:
    # torchrun exits 1; the aborted rank wrote nothing, its peer only saw the connection close.
    write(tmp_path, "result.json", {"status": "error", "message": "RuntimeError: Connection closed by peer"})
    (tmp_path / "trial.log").write_text(
        f"step 1\n{WATCHDOG_LINE}\nterminate called after throwing ...\nfailed (exitcode: -6) local_rank: 1\n"
    )
    with pytest.raises(errors.TrialCommFailure) as info:
        launcher._classify(1, tmp_path, tmp_path / "trial.log", [])
    assert str(info.value) == WATCHDOG_LINE and info.value.reason == "comm"
    assert isinstance(info.value, errors.TrialCrashed)  # still a crash for the sampler: not the config's verdict
    assert errors.exit_code_for("comm") == errors.ExitCode.ERROR


def test_a_named_failure_beats_a_watchdog_line(tmp_path: Path) -> None:
    write(tmp_path, "result.json.rank1", {"status": "oom", "message": "CUDA out of memory"})
    (tmp_path / "trial.log").write_text(WATCHDOG_LINE + "\n")
    with pytest.raises(errors.TrialOOM):
        launcher._classify(1, tmp_path, tmp_path / "trial.log", [])


@pytest.mark.usefixtures("repo_on_path")
def test_a_rank_aborted_by_the_watchdog_is_a_communication_failure(tmp_path: Path) -> None:
    cfg = TrialConfig(pipeline="tests.fault_pipelines:watchdog_abort", batch_size=4, warmup_steps=1, timed_steps=2)
    with pytest.raises(errors.TrialCommFailure, match="Watchdog caught collective operation timeout"):
        launcher.run_trial(cfg, tmp_path / "t", timeout_s=120)


# --- real trials ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_unet_trial_end_to_end(tiny_config: TrialConfig, tmp_path: Path) -> None:
    cfg = tiny_config.replace(
        num_workers=2,
        precision="bf16",
        optimizer_fusion="fused",
        channels_last=True,
        checkpoint_segments=2,
        timed_steps=4,
        window=2,
        num_threads=1,
    )  # one thread: steady speed on a shared 2-core machine
    r = launcher.run_trial(cfg, tmp_path / "trial", timeout_s=300)
    assert r.status == "ok", r.message
    assert set(KNOBS) <= set(r.applied), f"not recorded: {set(KNOBS) - set(r.applied)}"
    for k in KNOBS:
        assert r.applied[k]["requested"] == getattr(cfg, k), k
    assert r.applied["num_workers"]["in_effect"] == 2
    assert r.applied["optimizer_fusion"]["in_effect"] == "torch.optim.AdamW(fused=True)"
    assert r.applied["checkpoint_segments"]["in_effect"] == ["encoder.conv1", "encoder.layer1"]
    assert r.applied["channels_last"]["in_effect"] is True
    assert r.applied["precision"]["in_effect"] == "bf16" and "autocast(cpu, bf16)" in r.applied["precision"]["why"]
    assert r.applied["num_threads"]["in_effect"] == 1
    assert r.loss_finite and r.timed_steps == 4 and len(r.windows) == 2
    assert 0 <= r.data_wait_fraction <= 1
    assert r.startup_s > 0 and r.peak_memory_bytes > 0 and r.gpu_util is None
    assert r.samples_per_s > 0 and r.world_size == 1 and r.device == "cpu"
    assert json.loads((tmp_path / "trial" / "config.json").read_text()) == cfg.to_dict()  # saved beside the result
    assert len((tmp_path / "trial" / "progress.jsonl").read_text().splitlines()) == 2
    assert_nothing_left(tmp_path / "trial")


@pytest.mark.slow
def test_ddp_over_gloo_reports_global_samples_per_s(tmp_path: Path) -> None:
    # profile=True too: its extra steps must run on every rank, or rank 0 waits in DDP's all-reduce forever.
    # ~0.1 s steps ("slow"), so a few ms of skew between the ranks' clocks is lost in the comparison below.
    cfg = fault_cfg("slow", gpus=2, batch_size=4, timed_steps=4, window=2, profile=True)
    r = launcher.run_trial(cfg, tmp_path / "ddp", timeout_s=300)
    assert "Self CPU" in (tmp_path / "ddp" / "profile.txt").read_text()
    assert r.world_size == 2
    assert r.applied["gpus"]["requested"] == 2 and r.applied["gpus"]["in_effect"] == 2
    assert "gloo" in r.applied["gpus"]["why"]
    assert r.samples_per_s is not None and math.isfinite(r.samples_per_s) and r.samples_per_s > 0
    # The windows tile the timed region, so their durations add up to the elapsed time.
    samples = r.timed_steps * cfg.batch_size * 2
    elapsed = sum(cfg.window * cfg.batch_size * 2 / w for w in r.windows)
    assert r.samples_per_s == pytest.approx(samples / elapsed, rel=0.1)
    # ...and a step takes about elapsed / steps: global throughput counts both ranks' samples.
    assert 0.3 < r.samples_per_s / (samples / (r.timed_steps * r.step_time_p50)) < 3
    assert not (tmp_path / "ddp" / "result.json.rank1").exists()  # only rank 0 reports on success
    assert_nothing_left(tmp_path / "ddp")


@pytest.mark.slow
def test_oom_is_trial_oom_and_stale_results_are_not_reused(tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    trial_dir.mkdir()
    write(trial_dir, "result.json", TrialResult(status="ok", samples_per_s=1e9).to_dict())  # from an earlier run
    write(trial_dir, "result.json.rank1", {"status": "numerics", "message": "stale"})
    with pytest.raises(errors.TrialOOM, match="out of memory") as info:
        launcher.run_trial(fault_cfg("oom"), trial_dir, timeout_s=120)
    assert "OutOfMemoryError" in info.value.log_tail  # the traceback is kept in the log
    assert json.loads((trial_dir / "result.json").read_text())["status"] == "oom"


@pytest.mark.slow
def test_nan_loss_is_trial_numerics(tmp_path: Path) -> None:
    groups: list[tuple[int, int]] = []

    def on_start(pgid: int) -> None:
        groups.append((pgid, os.getpgid(pgid)))  # the process is alive and leads its own group

    with pytest.raises(errors.TrialNumerics, match="nan"):
        launcher.run_trial(fault_cfg("nan"), tmp_path / "t", timeout_s=120, on_start=on_start)
    assert len(groups) == 1 and groups[0][0] == groups[0][1] != os.getpgid(0)


@pytest.mark.slow
def test_apex_without_apex_is_trial_unsupported(tmp_path: Path) -> None:
    with pytest.raises(errors.TrialUnsupported, match=r"optimizer_fusion=apex.*apex.*not installed"):
        launcher.run_trial(fault_cfg(optimizer_fusion="apex"), tmp_path / "t", timeout_s=120)


@pytest.mark.slow
def test_dataset_smaller_than_a_batch_still_runs(tmp_path: Path) -> None:
    """Trials sample across epochs from one iterator, so a batch may be larger than the dataset."""
    r = launcher.run_trial(fault_cfg(batch_size=64), tmp_path / "t", timeout_s=120)
    assert r.status == "ok" and r.applied["sampler"]["in_effect"] == "EndlessShuffle(seed=0)"


@pytest.mark.slow
def test_sigkill_is_trial_crashed(tmp_path: Path) -> None:
    with pytest.raises(errors.TrialCrashed, match="signal") as info:
        launcher.run_trial(fault_cfg("sigkill"), tmp_path / "t", timeout_s=120)
    assert "SIGKILL" in str(info.value)
    assert_nothing_left(tmp_path / "t")


@pytest.mark.slow
def test_hang_in_build_dataset_times_out_and_leaves_nothing(tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialTimeout, match="process group killed") as info:
        launcher.run_trial(fault_cfg("hang_dataset"), trial_dir, timeout_s=6)
    assert info.value.partial == {"windows": []}
    assert_nothing_left(trial_dir)


class LauncherClock:
    """Stands in for the launcher's `time` module: the test can make its deadline pass on demand."""

    def __init__(self) -> None:
        self.skip = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skip

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.mark.slow
@pytest.mark.parametrize("gpus", [1, 2])
def test_hang_in_loss_with_workers_times_out_and_kills_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    report = tmp_path / "pids"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDS", str(report))
    clock = LauncherClock()
    monkeypatch.setattr(launcher, "time", clock)
    reports: list[dict[str, Any]] = []

    def on_window(step: int, samples_per_s: float) -> bool:
        # One good step is done, so every rank is hanging in (or about to enter) its second loss, with
        # its loader workers up. Wait for each rank's pid report, then let the trial's deadline pass:
        # a timeout that starts only once we know what must die, however slow the machine is today.
        deadline = time.monotonic() + 60
        while len(reports) < gpus and time.monotonic() < deadline:
            time.sleep(0.05)
            reports[:] = [json.loads(p.read_text()) for p in tmp_path.glob("pids.*") if not p.name.endswith(".tmp")]
        clock.skip = 1e6
        return False

    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialTimeout, match="process group killed"):
        launcher.run_trial(
            fault_cfg("hang_loss_reporting", num_workers=2, gpus=gpus, warmup_steps=0, window=1),
            trial_dir,
            timeout_s=300,
            on_window=on_window,
        )
    assert sorted(r["rank"] for r in reports) == list(range(gpus)), "the trial never reached its second loss"
    assert all(len(r["children"]) >= 2 for r in reports), reports  # the loader workers were running
    pids = [pid for r in reports for pid in (r["pid"], *r["children"])]
    assert_nothing_left(trial_dir, pids)


@pytest.mark.slow
def test_pruned_trial_keeps_partial_windows(tmp_path: Path) -> None:
    seen: list[tuple[int, float]] = []

    def on_window(step: int, samples_per_s: float) -> bool:
        seen.append((step, samples_per_s))
        return step >= 3

    trial_dir = tmp_path / "t"
    with pytest.raises(errors.TrialPruned) as info:
        launcher.run_trial(fault_cfg("slow", timed_steps=200, window=1), trial_dir, timeout_s=120, on_window=on_window)
    windows = info.value.partial["windows"]
    assert len(windows) >= 3 and all(w > 0 for w in windows)
    # The line says what it was judged on: its windows' measured time, not only their count.
    assert re.fullmatch(rf"pruned after {len(windows)} window\(s\), \d+\.\d s measured", str(info.value)), str(
        info.value
    )
    assert [s for s, _ in seen] == list(range(1, len(seen) + 1))
    assert [w for _, w in seen] == windows[: len(seen)]
    assert_nothing_left(trial_dir)


@pytest.mark.slow
def test_oom_on_one_ddp_rank_is_trial_oom(tmp_path: Path) -> None:
    with pytest.raises(errors.TrialOOM, match="rank 1"):
        launcher.run_trial(fault_cfg("oom_rank1", gpus=2), tmp_path / "t", timeout_s=300)
    assert_nothing_left(tmp_path / "t")


def test_live_processes_helper_sees_this_session(tmp_path: Path) -> None:
    # A sanity check of the helper the leak tests rely on: it finds a process by its command line.
    import subprocess

    marker = str(tmp_path / "marker-dir")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        assert [p.pid for p in live_processes(marker)] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert live_processes(marker) == []


@pytest.mark.slow
def test_ddp_compile_and_checkpointing_train_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """knobs wraps the checkpoints, then DDP, then compiles: dynamo's DDP optimizer once refused the
    checkpoint higher-order op in its graph (pytorch#104674). aot_eager runs dynamo and the DDP optimizer
    as inductor does, without minutes of code generation; gpu_check runs the same with inductor."""
    from autotune.trial.loop.knobs import COMPILE_BACKEND_ENV

    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    cfg = fault_cfg("tiny", gpus=2, compile="default", checkpoint_segments=2, warmup_steps=2, timed_steps=4)
    r = launcher.run_trial(cfg, tmp_path / "t", timeout_s=300)
    assert r.world_size == 2 and r.samples_per_s and r.samples_per_s > 0
    assert r.applied["compile"]["in_effect"] == "default"
    assert r.applied["checkpoint_segments"]["in_effect"] == ["0", "2"]  # the stages wrapped
    assert r.loss_last is not None and math.isfinite(r.loss_last)
    assert_nothing_left(tmp_path / "t")


# --- every other fresh process: the probe, train's runs ---------------------------------------------

_SPAWNS_A_SLEEPER = """
import subprocess, sys, time
# A child in a session of its own, like a torchrun rank: a kill of the leader's group alone misses it.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]], start_new_session=True)
time.sleep(600)
"""


def test_run_process_returns_the_exit_code_and_keeps_the_log(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    code = launcher.run_process([sys.executable, "-c", "print('hello'); raise SystemExit(7)"], log, timeout_s=60)
    assert code == 7 and log.read_text().strip() == "hello"


def test_run_process_at_its_timeout_kills_every_group_it_started(tmp_path: Path) -> None:
    marker = str(tmp_path / "sleeper-marker")
    t0 = time.monotonic()
    with pytest.raises(errors.TrialTimeout, match="no result after 3 s"):
        launcher.run_process(
            [sys.executable, "-c", _SPAWNS_A_SLEEPER, marker], tmp_path / "p.log", timeout_s=3, poll_s=0.1
        )
    assert time.monotonic() - t0 < 30
    left = wait_until_gone(marker)
    assert not left, [(p.pid, p.info.get("cmdline")) for p in left]


def test_probe_and_train_start_through_the_launcher() -> None:
    """One way to start a fresh process: neither the probe, the ceiling nor train spawns one of its own."""
    root = Path(launcher.__file__).resolve().parents[2]
    for module, call in (
        ("trial/probes/model_facts.py", "run_entry("),
        ("trial/probes/ceiling.py", "run_entry("),
        ("apply/train.py", "run_process("),
    ):
        text = (root / module).read_text()
        assert "subprocess" not in text and call in text, module
