"""Every fresh process autotune starts: a trial (warm fork, cold, torchrun or across nodes), the memory
probe and each of `train`'s runs. Each gets its own session and dies with its parent; its process groups
(torchrun's ranks included) are found while it lives and killed together at its timeout or on an
interrupt; the ranks' verdict files are read back as one cause (trial/loop/outcome.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO
from collections.abc import Callable, Mapping

import psutil

from autotune.core import errors
from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.files import write_json_atomic
from autotune.core.procs import CONTROLLER_ENV, die_with_parent, process_identity, signal_groups
from autotune.core.outcomes import Reason
from autotune.trial.processes.nodes import launcher_for
from autotune.trial.processes.placement import Placement
from autotune.trial.loop.outcome import named_failure, read_verdicts
from autotune.trial.processes.warm_client import (
    CUDA_LOST_CAUSE,
    EXPECT_CUDA_ENV,
    WarmProcess,
    WarmServer,
    WarmServerError,
)
from autotune.trial.loop.worker import LAUNCH_TIME_ENV

# Called with (steps so far, window samples/s); returning True stops the trial as pruned.
OnWindow = Callable[[int, float], bool]
# Called with the trial's process group id as soon as it exists (a study records it, so a later run can
# kill the group if this one dies without cleaning up); again if the trial is restarted cold.
OnStart = Callable[[int], None]
# Called with every other process group the trial's processes lead (torchrun's ranks), each time one
# appears; a study records them beside the leader's group, for the same reason.
OnGroups = Callable[[list[int]], None]

GROUPS_FILE = "ranks.json"  # {"leader": pgid, "groups": [pgid, ...]}, kept current while the trial runs
REFRESH_S = 1.0  # how often to look for new groups: psutil walks every process on the machine


def worker_args(trial_dir: Path) -> list[str]:
    """The worker's own arguments: after `python -m autotune.trial`, or handed to a warm fork."""
    return [
        "--config",
        str(trial_dir / "config.json"),
        "--out",
        str(trial_dir / "result.json"),
        "--progress",
        str(trial_dir / "progress.jsonl"),
    ]


def command(cfg: TrialConfig, trial_dir: Path) -> list[str]:
    """The trial's one process: `python -m autotune.trial` on this machine (under torchrun for several
    GPUs), or, with --nodes N, the node launcher's command that starts it on every node (trial/processes/nodes.py)."""
    placement = Placement.from_env()
    return launcher_for(placement).command(placement, cfg.gpus, trial_dir, worker_args(trial_dir))


class TrialGroups:
    """Every process group of one trial: the leader's (its loader workers) and those its descendants lead.

    torchrun starts each rank in a new session (torch.distributed.elastic's SubprocessHandler:
    start_new_session=True), so a signal to torchrun's group misses the ranks and their loader workers.
    torchrun forwards a SIGTERM to each rank's group, but what that doesn't end (a loader worker stuck in
    an uninterruptible read, code that traps SIGTERM) outlives torchrun, and nothing SIGKILLs it; and a
    torchrun that dies without forwarding (SIGKILLed, OOM-killed) leaves the ranks to PR_SET_PDEATHSIG,
    their loader workers orphaned. So the groups are looked up while the leader lives (afterwards its
    descendants can't be found), recorded, and signalled with the leader's.
    """

    def __init__(self, leader: int, trial_dir: Path | None = None, on_groups: OnGroups | None = None) -> None:
        self.leader = leader  # start_new_session / setsid: the leader's pid is its group id
        self.others: set[int] = set()
        self._path = None if trial_dir is None else trial_dir / GROUPS_FILE
        self._on_groups = on_groups
        self._checked = -math.inf
        try:  # a handle, not a pid: psutil refuses to list the children of a reused pid
            self._proc: psutil.Process | None = psutil.Process(leader)
        except psutil.Error:
            self._proc = None

    def all(self) -> list[int]:
        return [self.leader, *sorted(self.others)]

    def refresh(self, force: bool = False) -> None:
        """Add the groups the leader's descendants lead now (at most once per REFRESH_S unless forced)."""
        if self._proc is None or (not force and time.monotonic() - self._checked < REFRESH_S):
            return
        self._checked = time.monotonic()
        try:
            children = self._proc.children(recursive=True)
        except psutil.Error:  # the leader is gone (or its pid reused): nothing more to find
            self._proc = None
            return
        found = set()
        for child in children:
            try:
                found.add(os.getpgid(child.pid))
            except OSError:  # exited meanwhile
                continue
        new = found - self.others - {self.leader, os.getpgid(0)}
        if not new:
            return
        self.others |= new
        if self._path is not None:
            write_json_atomic(self._path, {"leader": self.leader, "groups": sorted(self.others)})
        if self._on_groups is not None:
            self._on_groups(sorted(self.others))


def kill_group(
    proc: subprocess.Popen[bytes] | WarmProcess, grace_s: float = 5.0, groups: TrialGroups | None = None
) -> None:
    """SIGTERM every process group of the trial (the leader's and, under torchrun, each rank's), wait up to
    grace_s for the leader, then SIGKILL them all."""
    groups = groups or TrialGroups(proc.pid)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is None:
            groups.refresh(force=True)  # ranks started since the last look
        if not signal_groups(groups.all(), sig):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; stragglers in its group and the ranks' groups still get the next signal.
    signal_groups(groups.all(), signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_trial(
    cfg: TrialConfig,
    trial_dir: Path,
    timeout_s: float,
    on_window: OnWindow | None = None,
    poll_s: float = 0.25,
    on_start: OnStart | None = None,
    server: WarmServer | None = None,
    on_groups: OnGroups | None = None,
) -> TrialResult:
    """Run one trial to completion. Returns its result or raises a classified TrialFailure."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(trial_dir / "config.json", cfg.to_dict())
    log_path = trial_dir / "trial.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    controller = process_identity(os.getpid())
    if controller is not None:  # lets a rank that started after torchrun died notice (die_with_parent)
        env[CONTROLLER_ENV] = controller
    with log_path.open("wb") as log:
        attempt = _Attempt(cfg, trial_dir, log, log_path, on_window, on_start, on_groups)
        code = attempt.run(env, timeout_s, poll_s, server)
        if server is not None and code != 0 and attempt.warm and _lost_cuda(trial_dir):
            # Not the config's fault: the server's forks can't reach the GPU. Measure it cold, and
            # start every later trial cold too (the server would fork the same broken state).
            server.mark_cuda_lost()
            log.seek(0, os.SEEK_END)  # after what the warm child appended
            log.write(b"autotune: the warm fork lost CUDA; retrying this trial cold\n")
            log.flush()
            code = attempt.run(env, timeout_s, poll_s, None)
    return _classify(code, trial_dir, log_path, attempt.windows)


class _Attempt:
    """One start of a trial's process and the wait for it (a warm fork that lost CUDA gets a second, cold one)."""

    def __init__(
        self,
        cfg: TrialConfig,
        trial_dir: Path,
        log: IO[bytes],
        log_path: Path,
        on_window: OnWindow | None,
        on_start: OnStart | None,
        on_groups: OnGroups | None,
    ) -> None:
        self.cfg, self.trial_dir, self.log, self.log_path = cfg, trial_dir, log, log_path
        self.on_window, self.on_start, self.on_groups = on_window, on_start, on_groups
        self.windows: list[float] = []
        self.seconds: list[float] = []  # each window's length: what a pruned trial was judged on
        self.warm = False

    def run(self, env: dict[str, str], timeout_s: float, poll_s: float, server: WarmServer | None) -> int:
        """Start the trial, wait for it (raising TrialTimeout or TrialPruned), return its exit code."""
        trial_dir, log_path, windows = self.trial_dir, self.log_path, self.windows
        for stale in (*trial_dir.glob("result.json*"), trial_dir / "progress.jsonl", trial_dir / GROUPS_FILE):
            stale.unlink(missing_ok=True)
        windows.clear()
        self.seconds.clear()
        env = {**env, LAUNCH_TIME_ENV: repr(time.time())}
        proc = _start(self.cfg, trial_dir, env, self.log, log_path, server)
        self.warm = isinstance(proc, WarmProcess)
        groups = TrialGroups(proc.pid, trial_dir, self.on_groups)
        try:
            if self.on_start is not None:
                self.on_start(proc.pid)  # start_new_session: the leader's pid is the group id
            deadline = time.monotonic() + timeout_s
            read = 0
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    kill_group(proc, groups=groups)
                    raise errors.TrialTimeout(
                        f"no result after {timeout_s:.0f} s; process group killed", tail(log_path), {"windows": windows}
                    )
                time.sleep(poll_s)
                groups.refresh()
                read, prune = _read_progress(trial_dir / "progress.jsonl", read, windows, self.seconds, self.on_window)
                if prune:
                    kill_group(proc, grace_s=1.0, groups=groups)
                    took = f", {sum(self.seconds):.1f} s measured" if self.seconds else ""
                    raise errors.TrialPruned(f"pruned after {len(windows)} window(s){took}", "", {"windows": windows})
            _read_progress(trial_dir / "progress.jsonl", read, windows, self.seconds, None)
        finally:
            # Loader workers or ranks left behind by a dying leader; on an interrupt (Ctrl-C, an error in
            # a callback) the whole trial, ranks included.
            kill_group(proc, grace_s=1.0, groups=groups)
        assert proc.returncode is not None
        return proc.returncode


def _start(
    cfg: TrialConfig, trial_dir: Path, env: dict[str, str], log: IO[bytes], log_path: Path, server: WarmServer | None
) -> subprocess.Popen[bytes] | WarmProcess:
    """Fork single-process trials from the warm server (torch already imported); cold otherwise,
    or when the server refuses. Either way: own process group, dies with its parent."""
    if server is not None and cfg.gpus == 1 and Placement.from_env().nodes == 1:
        try:
            return server.spawn(worker_args(trial_dir), _with_cuda_expectation(env), os.getcwd(), log_path)
        except WarmServerError as e:
            log.write(f"autotune: warm start unavailable, starting cold: {e}\n".encode())
            log.flush()
    return _spawn(command(cfg, trial_dir), env, log)


def _spawn(cmd: list[str], env: Mapping[str, str], log: IO[bytes] | None) -> subprocess.Popen[bytes]:
    """A process in its own session (so its whole group can be signalled) that dies with this one; its
    output to `log`, or to this terminal when there is none."""
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        env=dict(env),
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


class EntryFailed(Exception):
    """A measuring entry point (the probe, the ceiling) exited without its result: the code and its log's
    last line."""


def run_entry(module: str, cfg: TrialConfig, folder: Path, out_name: str, timeout_s: float) -> dict[str, object]:
    """`python -m module --config C --out O` in a fresh process, over `cfg`, in `folder` (its log beside O,
    as O's stem + .log); O's JSON. Raises EntryFailed, or TrialTimeout when `timeout_s` passes."""
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "config.json", cfg.to_dict())
    out = folder / out_name
    log = out.with_suffix(".log")
    out.unlink(missing_ok=True)
    code = run_process(
        [sys.executable, "-m", module, "--config", str(folder / "config.json"), "--out", str(out)], log, timeout_s
    )
    if code != 0 or not out.is_file():
        lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
        raise EntryFailed(f"exited with code {code}: {lines[-1] if lines else 'no output'}")
    return dict(json.loads(out.read_text()))


def run_process(
    cmd: list[str],
    log_path: Path | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.25,
) -> int:
    """Run `cmd` (a probe, a training run) to its end and return its exit code. At `timeout_s` its process
    groups are killed and TrialTimeout raised; on an interrupt they are killed before it propagates."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(log_path.open("wb")) if log_path is not None else None
        proc = _spawn(cmd, env, log)
        groups = TrialGroups(proc.pid)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                try:
                    return proc.wait(timeout=poll_s)
                except subprocess.TimeoutExpired:
                    pass
                if deadline is not None and time.monotonic() > deadline:
                    raise errors.TrialTimeout(
                        f"no result after {timeout_s:.0f} s; process group killed", tail(log_path) if log_path else ""
                    )
                groups.refresh()
        finally:
            kill_group(proc, grace_s=1.0, groups=groups)


def _with_cuda_expectation(env: dict[str, str]) -> dict[str, str]:
    """Tell a warm fork to fail, rather than fall back to the CPU, if it can't see the GPU this controller sees.

    Asked of the controller's torch only if already imported (a search imports it to detect the hardware):
    importing it here would cost seconds. An explicit EXPECT_CUDA_ENV in the env wins (0 turns the check off).
    """
    torch = sys.modules.get("torch")
    if EXPECT_CUDA_ENV in env or torch is None:
        return env
    if env.get("CUDA_VISIBLE_DEVICES") != os.environ.get("CUDA_VISIBLE_DEVICES"):
        return env  # the trial is meant to see other devices than this process does: no opinion
    return {**env, EXPECT_CUDA_ENV: "1"} if torch.cuda.is_available() else env


def _lost_cuda(trial_dir: Path) -> bool:
    try:
        return json.loads((trial_dir / "result.json").read_text()).get("cause") == CUDA_LOST_CAUSE
    except (OSError, ValueError, AttributeError):
        return False


def _read_progress(
    path: Path, offset: int, windows: list[float], seconds: list[float], on_window: OnWindow | None
) -> tuple[int, bool]:
    """Consume new throughput windows (their figures into `windows`, their lengths into `seconds`); returns
    the new offset and whether to prune."""
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
        if "seconds" in rec:
            seconds.append(float(rec["seconds"]))
        if on_window is not None and on_window(rec["step"], rec["samples_per_s"]):
            prune = True
    return offset + len(complete), prune


def _classify(code: int, trial_dir: Path, log_path: Path, windows: list[float]) -> TrialResult:
    verdicts = read_verdicts(p for p in trial_dir.glob("result.json*") if p.is_file())
    ok = next((v for v in verdicts if v.get("status") == "ok"), None)
    if code == 0 and ok is not None:
        return TrialResult.from_dict(ok)
    failed = named_failure(verdicts)
    status = failed["status"] if failed else errors.reason_for_exit(code)
    watchdog = comm_failure(log_path) if status == Reason.ERROR else None
    if watchdog is not None:
        # NCCL's watchdog aborts a rank from a C++ thread (SIGABRT): it writes no verdict, and its peers
        # at most an "error" (connection closed). Its own log line is the only account of the cause.
        status, message = Reason.COMM, watchdog
    elif code < 0:
        message = f"killed by signal {signal.Signals(-code).name}"
    elif failed:
        message = failed.get("message", "")
    else:
        message = f"exited with code {code} and no result"
    raise errors.failure_class(status)(message, tail(log_path), {"windows": windows})


# What ProcessGroupNCCL logs (LOG(ERROR)) before its watchdog takes the process down, most telling first:
# the collective that timed out names its operation and rank; the others only say that contact was lost.
WATCHDOG_MARKERS = (
    "Watchdog caught collective operation timeout",
    "Process group watchdog thread terminated with exception",
    "Some NCCL operations have failed or timed out",
    "watchdog got stuck for",  # the heartbeat monitor: the watchdog itself hung
)
_LOG_SCAN_BYTES = 1 << 20  # the end of the log: a long trial's early output cannot hold its abort


def comm_failure(log_path: Path) -> str | None:
    """The NCCL watchdog's line that says why it aborted a rank, if the log has one."""
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, log_path.stat().st_size - _LOG_SCAN_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for marker in WATCHDOG_MARKERS:
        hit = next((line.strip() for line in lines if marker in line), None)
        if hit is not None:
            return hit
    return None
