"""Turn a TrialConfig into an isolated process, wait for it with a timeout, classify the exit."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable

from autotune.core import errors
from autotune.core.config import TrialConfig, TrialResult
from autotune.core.files import write_json_atomic
from autotune.core.procs import die_with_parent, signal_group
from autotune.trial.warm import WarmProcess, WarmServer, WarmServerError
from autotune.trial.worker import LAUNCH_TIME_ENV

# Called with (steps so far, window samples/s); returning True stops the trial as pruned.
OnWindow = Callable[[int, float], bool]
# Called once with the trial's process group id as soon as it exists (a study records it, so a later
# run can kill the group if this one dies without cleaning up).
OnStart = Callable[[int], None]



def worker_args(trial_dir: Path) -> list[str]:
    """The worker's own arguments: after `python -m autotune.trial`, or handed to a warm fork."""
    return ["--config", str(trial_dir / "config.json"), "--out", str(trial_dir / "result.json"),
            "--progress", str(trial_dir / "progress.jsonl")]


def python_for(gpus: int) -> list[str]:
    """The interpreter a trial or training run starts with: under torchrun, one rank per GPU, when gpus > 1."""
    if gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus)]
    return [sys.executable]


def command(cfg: TrialConfig, trial_dir: Path) -> list[str]:
    return [*python_for(cfg.gpus), "-m", "autotune.trial", *worker_args(trial_dir)]


def kill_group(proc: subprocess.Popen[bytes] | WarmProcess, grace_s: float = 5.0) -> None:
    """SIGTERM the trial's whole process group (torchrun ranks, loader workers), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not signal_group(proc.pid, sig):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; stragglers in its group still get the next signal.
    signal_group(proc.pid, signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_trial(cfg: TrialConfig, trial_dir: Path, timeout_s: float,
              on_window: OnWindow | None = None, poll_s: float = 0.25,
              on_start: OnStart | None = None, server: WarmServer | None = None) -> TrialResult:
    """Run one trial to completion. Returns its result or raises a classified TrialFailure."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    for stale in (*trial_dir.glob("result.json*"), trial_dir / "progress.jsonl"):
        stale.unlink(missing_ok=True)
    write_json_atomic(trial_dir / "config.json", cfg.to_dict())
    log_path = trial_dir / "trial.log"
    env = {**os.environ, LAUNCH_TIME_ENV: repr(time.time()), "PYTHONUNBUFFERED": "1"}
    windows: list[float] = []
    with log_path.open("wb") as log:
        proc = _start(cfg, trial_dir, env, log, log_path, server)
        try:
            if on_start is not None:
                on_start(proc.pid)  # start_new_session: the leader's pid is the group id
            deadline = time.monotonic() + timeout_s
            read = 0
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    kill_group(proc)
                    raise errors.TrialTimeout(f"no result after {timeout_s:.0f} s; process group killed",
                                              tail(log_path), {"windows": windows})
                time.sleep(poll_s)
                read, prune = _read_progress(trial_dir / "progress.jsonl", read, windows, on_window)
                if prune:
                    kill_group(proc, grace_s=1.0)
                    raise errors.TrialPruned(f"pruned after {len(windows)} window(s)", "", {"windows": windows})
            _read_progress(trial_dir / "progress.jsonl", read, windows, None)
        finally:
            kill_group(proc, grace_s=1.0)  # loader workers or ranks left behind by a dying leader
    return _classify(proc.returncode, trial_dir, log_path, windows)


def _start(cfg: TrialConfig, trial_dir: Path, env: dict[str, str], log: IO[bytes], log_path: Path,
           server: WarmServer | None) -> subprocess.Popen[bytes] | WarmProcess:
    """Fork single-process trials from the warm server (torch already imported); cold otherwise,
    or when the server refuses. Either way: own process group, dies with its parent."""
    if server is not None and cfg.gpus == 1:
        try:
            return server.spawn(worker_args(trial_dir), env, os.getcwd(), log_path)
        except WarmServerError as e:
            log.write(f"autotune: warm start unavailable, starting cold: {e}\n".encode())
            log.flush()
    return subprocess.Popen(command(cfg, trial_dir), stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, preexec_fn=die_with_parent)


def _read_progress(path: Path, offset: int, windows: list[float],
                   on_window: OnWindow | None) -> tuple[int, bool]:
    """Consume new throughput windows; returns the new offset and whether to prune."""
    try:
        with path.open() as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset, False
    complete = chunk[: chunk.rfind("\n") + 1]  # a half-written line waits for the next poll
    prune = False
    for line in complete.splitlines():
        rec = json.loads(line)
        windows.append(rec["samples_per_s"])
        if on_window is not None and on_window(rec["step"], rec["samples_per_s"]):
            prune = True
    return offset + len(complete), prune


def _classify(code: int, trial_dir: Path, log_path: Path, windows: list[float]) -> TrialResult:
    verdicts = [json.loads(p.read_text()) for p in sorted(trial_dir.glob("result.json*")) if p.is_file()]
    ok = next((v for v in verdicts if v.get("status") == "ok"), None)
    if code == 0 and ok is not None:
        return TrialResult.from_dict(ok)
    # Under DDP one rank's OOM leaves the others failing in a collective ("error", connection closed):
    # a named failure on any rank is the cause, so it wins over a generic one.
    failed = min((v for v in verdicts if v.get("status") != "ok"), key=lambda v: v.get("status") == "error",
                 default=None)
    status = failed["status"] if failed else errors.reason_for_exit(code)
    if code < 0:
        message = f"killed by signal {signal.Signals(-code).name}"
    elif failed:
        message = failed.get("message", "")
    else:
        message = f"exited with code {code} and no result"
    raise errors.failure_class(status)(message, tail(log_path), {"windows": windows})
