"""The warm fork server: `python -m autotune.trial.processes.warm_server`. It imports torch and the pipeline
once, then forks one trial per request; see autotune.trial.processes.warm_client for the protocol and the controller.
Before the first trial of a pipeline that allows it, it has the model's initial weights drawn once
(autotune.trial.loop.warm_model).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import signal
import socket
import sys
import time
from typing import Any
from collections.abc import Callable, Sequence

from autotune.core.procs import die_with_parent, signal_group
from autotune.trial.loop import warm_model
from autotune.trial.processes.warm_client import IMPORT_TIME_ENV
from autotune.trial.processes.warm_child import base_sys_path, child

MAX_PREBUILT = 4  # models drawn ahead per server: a search has one (pipeline, seed, rank)
PREBUILD_TIMEOUT_S = 120.0  # a builder draws one model; longer than this, it is stuck


def serve(sock_path: str, parent: int, preload: Sequence[str]) -> int:
    import importlib

    die_with_parent()
    if os.getppid() != parent:  # the controller died before PR_SET_PDEATHSIG took hold
        return 1
    # A fresh interpreter's handlers (SIGINT -> KeyboardInterrupt, SIGPIPE ignored): what each child
    # gets back, because the server is about to install its own.
    fresh: dict[int, Any] = {
        s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE)
    }
    t0 = time.perf_counter()
    for name in preload:
        importlib.import_module(name)
    gc.freeze()  # the preloaded heap: the children's collector won't walk it, so it stays shared (copy-on-write)
    server = _Server(sock_path, fresh, {k: os.environ.get(k) for k in IMPORT_TIME_ENV}, base_sys_path())
    print(
        f"autotune warm server: pid {os.getpid()}, {len(preload)} module(s) in {time.perf_counter() - t0:.2f} s, "
        f"{len(os.listdir('/proc/self/task'))} OS thread(s); listening on {sock_path}",
        flush=True,
    )
    server.loop()
    server.stop()
    return 0


class _Server:
    """The fork server's state: its listener and wake-up pipe, the connections whose request is still
    arriving, and each child with the connection of the controller that waits for it."""

    def __init__(
        self, sock_path: str, fresh: dict[int, Any], import_env: dict[str, str | None], base_path: list[str]
    ) -> None:
        import selectors

        self.sock_path, self.fresh, self.import_env, self.base_path = sock_path, fresh, import_env, base_path
        self.read = selectors.EVENT_READ
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)  # SIGCHLD/SIGTERM wake the select below
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        self.listener.listen(16)
        self.sel.register(self.listener, self.read, "accept")
        self.sel.register(self.wake_r, self.read, "wake")
        self.pending: dict[socket.socket, bytes] = {}  # connections whose request is still arriving
        self.children: dict[int, socket.socket | None] = {}  # pid -> its controller connection (None: gone)
        self.owner: dict[socket.socket, int] = {}
        self.prebuilt: set[tuple[str, int, int]] = set()  # the (pipeline, seed, rank)s a builder has tried

    def loop(self) -> None:
        """Serve until SIGTERM."""
        stopping = False
        while not stopping:
            for key, _ in self.sel.select(timeout=1.0):  # the timeout: reap even if a SIGCHLD was coalesced away
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    self.pending[conn] = b""
                    self.sel.register(conn, self.read, "conn")
                elif key.data == "wake":
                    try:
                        stopping |= signal.SIGTERM in os.read(self.wake_r, 512)
                    except BlockingIOError:
                        pass
                else:
                    assert isinstance(key.fileobj, socket.socket)
                    self._readable(key.fileobj)
            self.reap()

    def _readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            pid = self.owner.get(conn)
            if pid is not None and pid in self.children:  # the controller gave up on a running trial
                signal_group(pid)
            self.drop(conn)
        elif conn in self.pending:
            self.pending[conn] += data
            if b"\n" in self.pending[conn]:
                self._start(conn, self.pending.pop(conn).split(b"\n", 1)[0])

    def _start(self, conn: socket.socket, request: bytes) -> None:
        """Fork the child `request` asks for, and tell its controller the pid (or why not)."""
        keep = [self.listener, self.wake_r, self.wake_w, self.sel, conn, *self.pending, *self.owner]
        try:
            checked = _check(request, self.import_env)
            self._prebuild(checked, keep)
            pid = _fork(checked, keep, self.fresh, self.base_path)
        except (_Refused, OSError) as e:  # a bad request never takes the server (and its trials) down
            # OSError: EAGAIN/ENOMEM from fork, the machine is short of processes or memory.
            _send(conn, {"error": str(e) if isinstance(e, _Refused) else f"fork failed: {e}"})
            self.drop(conn)
            return
        self.children[pid] = conn
        self.owner[conn] = pid
        _send(conn, {"pid": pid})  # if the controller is gone, its EOF kills the child next

    def _prebuild(self, request: dict[str, Any], keep: list[Any]) -> None:
        """Before the first trial of a (pipeline, seed, rank) whose pipeline declares model_key: draw its
        model once, in a builder forked and set up as that trial would be, and load it for every child
        forked after (warm_model). Waited for here: this trial is the first to start from it."""
        wanted = warm_model.wanted(request["argv"], request["env"])
        if wanted is None or wanted in self.prebuilt or len(self.prebuilt) >= MAX_PREBUILT:
            return
        self.prebuilt.add(wanted)
        out = os.path.join(os.path.dirname(self.sock_path), f"model-{len(self.prebuilt)}.pt")
        t0 = time.perf_counter()
        try:
            job = functools.partial(warm_model.build_entry, out=out)
            code = _wait_for(_fork({**request, "log": out + ".log"}, keep, self.fresh, self.base_path, job))
            if code == 0:
                warm_model.load(out)
                gc.freeze()  # the model's objects too: the children's collector leaves them shared
            what = "model drawn" if code == 0 else f"no model (builder exit {code}; its log: {out}.log)"
        except Exception as e:  # noqa: BLE001 - the trials build their own, as without a server
            what = f"no model ({type(e).__name__}: {e})"
        print(f"autotune warm server: {wanted}: {what} in {time.perf_counter() - t0:.2f} s", flush=True)

    def drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        self.pending.pop(conn, None)
        pid = self.owner.pop(conn, None)
        if pid is not None and self.children.get(pid) is conn:
            self.children[pid] = None
        conn.close()

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                self.drop(conn)

    def stop(self) -> None:
        for pid in self.children:  # stopping: no trial outlives its server
            signal_group(pid)
        deadline = time.monotonic() + 10.0
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        self.listener.close()
        os.unlink(self.sock_path)


class _Refused(Exception):
    pass


def _send(conn: socket.socket, msg: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(msg).encode() + b"\n")
    except OSError:
        pass  # the controller is gone; the connection's EOF is handled where it is read


def _check(raw: bytes, import_env: dict[str, str | None]) -> dict[str, Any]:
    """One request, parsed, if a child can be forked for it; raises _Refused with the reason it can't."""
    import threading

    try:
        request = json.loads(raw)
        ok = isinstance(request, dict) and all(
            isinstance(request.get(k), t) for k, t in (("argv", list), ("env", dict), ("cwd", str), ("log", str))
        )
    except ValueError:
        ok = False
    if not ok:
        raise _Refused("malformed request: expected JSON with argv, env, cwd and log")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise _Refused("the server has initialised CUDA; a forked child could not use it")
    if threading.active_count() > 1:
        raise _Refused(
            f"the server runs {threading.active_count()} Python threads; forking would copy their locks mid-use"
        )
    differ = [k for k, v in import_env.items() if request["env"].get(k) != v]
    if differ:
        raise _Refused(f"{', '.join(differ)} differ(s) from the server's, and is read at import time")
    return request


def _fork(
    request: dict[str, Any],
    server_fds: list[Any],
    fresh: dict[int, Any],
    base_path: list[str],
    job: Callable[[list[str]], int] | None = None,
) -> int:
    """Fork a child for this request (its trial, or `job`); return its pid once it leads its own group."""
    torch = sys.modules.get("torch")
    assert torch is None or not torch.cuda.is_initialized(), "CUDA must not be initialised before fork"
    sys.stdout.flush()  # or the child would inherit, and later write, the server's unflushed output
    sys.stderr.flush()
    ready_r, ready_w = os.pipe()
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        child(request, server, ready_w, server_fds, fresh, base_path, job)
    os.close(ready_w)
    # Reply only after the child's setsid(): a killpg(pid) sent as soon as the pid is known must find
    # the group. EOF (the child died first) is fine too: its exit is reaped and reported.
    os.read(ready_r, 1)
    os.close(ready_r)
    return pid


def _wait_for(pid: int, timeout_s: float = PREBUILD_TIMEOUT_S) -> int:
    """A builder's exit code; one still running after timeout_s is killed (-SIGKILL)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            signal_group(pid)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.trial.processes.warm_server", description="Serve warm (forked) trial starts."
    )
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--parent", type=int, required=True, help="the controller's pid: exit if it is gone")
    parser.add_argument("--preload", action="append", default=[], help="module to import once (repeatable)")
    args = parser.parse_args(argv)
    return serve(args.socket, args.parent, args.preload)


if __name__ == "__main__":
    sys.exit(main())
