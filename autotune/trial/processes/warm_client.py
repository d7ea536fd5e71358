"""Warm trial start: a long-lived server that imported torch and the pipeline once forks one trial per request.

A cold `python -m autotune.trial` spends seconds importing torch, torchvision and smp before it does
anything config-specific. The server pays that once; each trial is then a fork that runs
`autotune.trial.loop.worker.main(argv)` in a child which is, to the launcher, a trial process like any other:
its own process group (killable with `os.killpg(pid, SIGKILL)`, loader workers included), its own
log, env and cwd, and an exit code that means what a cold trial's exit code means.

Fork is safe because the server never initialises CUDA (the child does, after the fork) and never
runs a torch op, so no intra-op/OpenMP pool exists to be copied half-alive. (A pipeline's initial
model is drawn by a builder child and only mapped from its file by the server: autotune.trial.loop.warm_model.) (numpy's OpenBLAS starts
its pool on import, as in every cold trial; OpenBLAS re-creates it in a forked child itself.)
A pipeline module may still ask `torch.cuda.is_available()` at import time, which by default calls
cuInit without marking torch's CUDA initialised, so the server's guard can't see it and its children may
find CUDA broken and quietly train on the CPU. Hence the server runs with PYTORCH_NVML_BASED_CUDA_CHECK=1
(torch then answers from NVML, without cuInit), and a child told that CUDA is expected
(EXPECT_CUDA_ENV=1, set by the launcher when the controller sees a GPU) that can't see it fails loudly
instead, with CUDA_LOST_CAUSE in its verdict: the launcher then runs the trial, and every later one, cold.

Protocol: one Unix-socket connection per trial, newline-delimited JSON.
    controller -> server   {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}
    server -> controller   {"pid": N}            the child exists and leads its own process group
                           {"error": "..."}      refused (the launcher starts this trial cold)
    server -> controller   {"returncode": rc}    the child was reaped; rc < 0 is a signal, as in Popen
A controller that closes the connection before the exit report has given up on the trial: the
server kills the child's group rather than leave it running unwatched.

The controller side (WarmServer, WarmProcess) imports nothing heavy; the server is `python -m autotune.trial.processes.warm_server`.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any
from collections.abc import Mapping, Sequence

from autotune.core.procs import die_with_parent

# Pipeline-neutral; the caller adds what its pipeline needs (autotune.pipelines.preload_modules).
# Everything a trial imports on its way to the first timed step belongs here: imported after the fork,
# a module is read (and, under PYTHONDONTWRITEBYTECODE, compiled) again by every trial, inside startup_s.
# tests/trial/processes/test_warm_preload.py fails when the worker's path gains an import missing from this list.
# torch._dynamo: every torch.optim optimizer imports it lazily on construction (its
# _disable_dynamo decorator), a second or more of each forked trial's start-up (benchmarks/README.md).
# measure, clock, observe, outcome: the worker imports them inside its functions (run, main).
DEFAULT_PRELOAD = (
    "torch",
    "torch._dynamo",
    "autotune.trial.loop.worker",
    "autotune.trial.loop.harness",
    "autotune.trial.measurement.measure",
    "autotune.trial.measurement.clock",
    "autotune.trial.measurement.observe",
    "autotune.trial.loop.outcome",
    "autotune.core.configfile",
)
# Read once, when a module is imported or a library loaded, so the server's value is the one every
# child lives with. A trial that asks for a different value can't be forked honestly: it starts cold.
IMPORT_TIME_ENV = (
    "HF_HUB_OFFLINE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTHONHASHSEED",
    "PYTHONOPTIMIZE",
    "PYTHONDONTWRITEBYTECODE",
)
# torch.cuda.is_available() answers from NVML, without initialising the CUDA driver (torch/cuda/__init__.py,
# _nvml_based_avail): set for the server, unless the user chose a value, so an import-time check is harmless.
# (Where NVML itself fails torch falls back to cuInit: the child's EXPECT_CUDA_ENV check catches that.)
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
EXPECT_CUDA_ENV = "AUTOTUNE_EXPECT_CUDA"  # "1" in a request: the child must see a GPU or fail
CUDA_LOST_CAUSE = "warm_cuda_lost"  # the "cause" in the verdict of a child that could not


class WarmServerError(RuntimeError):
    """The warm server can't run this trial (dead, refused, unreachable): start it cold instead."""


# --- controller side ------------------------------------------------------------------------------


class WarmProcess:
    """The part of subprocess.Popen the launcher uses, for a trial forked by the warm server."""

    def __init__(self, pid: int, conn: socket.socket, args: list[str]) -> None:
        self.pid = pid  # == its process group id: the child called setsid() before the server replied
        self.args = args
        self.returncode: int | None = None
        self.server_lost = False  # the server died before reporting this child's exit
        self._conn = conn
        self._buf = b""

    def poll(self) -> int | None:
        if self.returncode is None:
            self._receive(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._receive(left)
        return self.returncode

    def _receive(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        data = self._conn.recv(4096)
        if not data:
            # The server is gone without reporting: its death SIGKILLed the child (PR_SET_PDEATHSIG),
            # and what a Popen would report for that is -SIGKILL.
            self.server_lost = True
            self._finish(-signal.SIGKILL)
            return
        self._buf += data
        while b"\n" in self._buf and self.returncode is None:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if "returncode" in msg:
                self._finish(int(msg["returncode"]))

    def _finish(self, code: int) -> None:
        self.returncode = code
        self._conn.close()


class WarmServer:
    """A `python -m autotune.trial.processes.warm_server` process, and the way to ask it for trials. Not thread-safe.

    The server dies with the thread that started it (PR_SET_PDEATHSIG), so start it from the thread
    that lives as long as the study (the main thread), and a killed controller leaves no server.
    """

    def __init__(self, proc: subprocess.Popen[bytes], folder: Path) -> None:
        self._proc = proc
        self._folder = folder  # private (0700): the socket and the server's own log
        self.socket_path = folder / "server.sock"
        self.log_path = folder / "server.log"
        self.cuda_lost = False  # a child found CUDA broken: its siblings would too, so spawn no more

    @classmethod
    def start(
        cls, preload: Sequence[str] = DEFAULT_PRELOAD, *, env: Mapping[str, str] | None = None, timeout_s: float = 180.0
    ) -> WarmServer:
        """Start the server and return once it has imported `preload` and listens. Raises WarmServerError."""
        folder = Path(tempfile.mkdtemp(prefix="autotune-warm-"))
        cmd = [
            sys.executable,
            "-m",
            "autotune.trial.processes.warm_server",
            "--socket",
            str(folder / "server.sock"),
            "--parent",
            str(os.getpid()),
            *(f"--preload={m}" for m in preload),
        ]
        server_env = dict(os.environ if env is None else env)
        server_env.setdefault(NVML_CHECK_ENV, "1")  # a child's env is its request's: it won't inherit this
        with (folder / "server.log").open("wb") as log:
            # Its own session, like a trial: a Ctrl-C at the terminal reaches the controller, which
            # then closes the server, instead of killing both mid-trial.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        server = cls(proc, folder)
        deadline = time.monotonic() + timeout_s
        # The server binds only after its imports, so the first connect that succeeds means "ready".
        while not server._can_connect():
            if proc.poll() is not None or time.monotonic() > deadline:
                why = server._describe_death() if proc.poll() is not None else f"not ready after {timeout_s:.0f} s"
                server.close()
                raise WarmServerError(f"warm server did not start: {why}")
            time.sleep(0.05)
        return server

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(
        self, argv: list[str], env: Mapping[str, str], cwd: str | os.PathLike[str], log_path: str | os.PathLike[str]
    ) -> WarmProcess:
        """Fork a child that runs `autotune.trial.loop.worker.main(argv)` with this env and cwd, stdout and stderr
        appended to log_path. Raises WarmServerError if the server can't (the caller starts it cold)."""
        if not self.alive():
            raise WarmServerError(f"warm server is not running: {self._describe_death()}")
        if self.cuda_lost:
            raise WarmServerError("an earlier warm fork lost CUDA (see its trial log); trials start cold")
        request = {"argv": list(argv), "env": dict(env), "cwd": os.path.abspath(cwd), "log": os.path.abspath(log_path)}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(30.0)  # a fork takes milliseconds; this only bounds a wedged server
            conn.connect(str(self.socket_path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = read_line(conn)
        except OSError as e:
            conn.close()
            raise WarmServerError(f"warm server unreachable ({e}); {self._describe_death()}") from None
        if reply is None or "pid" not in reply:
            conn.close()
            why = reply["error"] if reply else f"it closed the connection; {self._describe_death()}"
            raise WarmServerError(f"warm server refused the trial: {why}")
        conn.settimeout(None)
        return WarmProcess(int(reply["pid"]), conn, ["autotune.trial.processes.warm_server", *argv])

    def mark_cuda_lost(self) -> None:
        """A child of this server reported CUDA_LOST_CAUSE: refuse further spawns (the caller starts them cold)."""
        self.cuda_lost = True

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the server; it SIGKILLs the process group of every child still running first."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()  # its children still die: PR_SET_PDEATHSIG
                self._proc.wait()
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> WarmServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _can_connect(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(self.socket_path))
            except OSError:
                return False
        return True

    def _describe_death(self) -> str:
        code = self._proc.poll()
        state = "still running" if code is None else f"exit code {code}"
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = ""
        return f"server {state}" + (f"; its log ends:\n{tail}" if tail else "")


def read_line(conn: socket.socket) -> dict[str, Any] | None:
    buf = b""
    while b"\n" not in buf:
        data = conn.recv(4096)
        if not data:
            return None
        buf += data
    msg: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return msg
