"""What a child of the warm fork server does between fork() and exit: leave the server's session,
signals and files behind, become `python -m autotune.trial argv` in the request's environment, run the
trial, and always reach os._exit (it must never fall back into the server's loop)."""

from __future__ import annotations

import atexit
import importlib
import io
import os
import random
import signal
import sys
import traceback
from typing import Any, NoReturn
from collections.abc import Callable, Mapping

from autotune.core.errors import exit_code_for
from autotune.core.files import write_json_atomic
from autotune.core.procs import die_with_parent
from autotune.core.outcomes import Reason
from autotune.trial.loop import worker
from autotune.trial.processes.warm_client import CUDA_LOST_CAUSE, EXPECT_CUDA_ENV


def child(
    request: dict[str, Any],
    server: int,
    ready_w: int,
    server_fds: list[Any],
    fresh: dict[int, Any],
    base_path: list[str],
    job: Callable[[list[str]], int] | None = None,
) -> NoReturn:
    """Become a trial process, as if started by `python -m autotune.trial argv`, run it (or `job(argv)`,
    the server's own work done as that trial would see it: see warm_model), and exit with its code.
    Never returns: whatever happens, this process must not fall back into the server's loop."""
    code = 1
    try:
        os.setsid()  # own session and group: killpg(pid) reaches this child and its loader workers
        die_with_parent()
        # Before the pid is announced (no one can signal us yet): a SIGTERM caught by the server's
        # handler would write to the server's wake-up pipe and stop the server.
        signal.set_wakeup_fd(-1)
        for sig, handler in fresh.items():
            signal.signal(sig, handler)
        os.write(ready_w, b".")
        os.close(ready_w)
        if os.getppid() != server:  # the server died between fork and PR_SET_PDEATHSIG
            os._exit(1)
        for obj in server_fds:
            obj.close() if hasattr(obj, "close") else os.close(obj)
        _redirect(request["log"], unbuffered=bool(request["env"].get("PYTHONUNBUFFERED")))
        _become(request, base_path)
        code = (job or trial)(request["argv"])
    except BaseException:  # noqa: BLE001 - the child must reach os._exit
        _print_exc()
    finally:
        _flush()
        os._exit(code)


def _redirect(log: str, unbuffered: bool) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # append: the caller may have written to it
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # New text streams on fds 1/2, unbuffered when the env asks for it (PYTHONUNBUFFERED acts only at
    # interpreter start, which this child never had).
    for name, fd in (("stdout", 1), ("stderr", 2)):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding="utf-8",
            errors="backslashreplace",
            write_through=unbuffered,
            line_buffering=not unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _become(request: dict[str, Any], base_path: list[str]) -> None:
    """Env, cwd, sys.path, argv and RNG state as a cold `python -m autotune.trial` would have them."""
    os.environ.clear()  # replaced, not merged: putenv/unsetenv reach C libraries too
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = _child_sys_path(request["env"], base_path)
    importlib.invalidate_caches()
    sys.argv = [worker.__file__, *request["argv"]]
    # Forked children share the server's RNG states; a cold start seeds from the OS. (The trial then
    # seeds torch from cfg.seed itself, so its measurements stay reproducible.) torch's CPU generator
    # only: torch.seed() would also queue a reseed of every CUDA, XPU and MTIA generator (a few ms of
    # each trial's start-up), which the server never created, so they start as a cold process's do.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()


def trial(argv: list[str]) -> int:
    """The trial itself, once this process has become it."""
    lost = _cuda_lost() if os.environ.get(EXPECT_CUDA_ENV) == "1" else None
    return _fail_cuda_lost(argv, lost) if lost else _run_trial(argv)


def _cuda_lost() -> str | None:
    """Why this child can't use the CUDA its controller sees, or None if it can.

    Something in the server (a pipeline module asking torch.cuda.is_available() at import, without the
    server's NVML check, say) initialised the driver before the fork; the worker would find no GPU and
    train on the CPU, a valid-looking result for the wrong device."""
    try:
        import torch

        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
        if count > 0:
            return None
        why = f"torch.cuda.is_available() is {available}, device_count() is {count}"
    except Exception as e:  # noqa: BLE001 - any failure to reach CUDA is the answer
        why = f"{type(e).__name__}: {e}"
    return (
        f"the warm fork lost CUDA ({why}, though the controller sees a GPU): something initialised CUDA "
        "in the warm server before the fork, e.g. a CUDA call at import time in the pipeline's module; "
        "run with --cold-start to start every trial as a fresh interpreter"
    )


def _fail_cuda_lost(argv: list[str], message: str) -> int:
    """End the trial as the worker ends a crash (verdict, stderr line, exit code), marked CUDA_LOST_CAUSE
    so the launcher can retry it cold. Never run it: on the CPU it would measure the wrong machine."""
    if "--out" in argv[:-1]:
        verdict = {"status": Reason.ERROR, "message": message, "cause": CUDA_LOST_CAUSE}
        write_json_atomic(argv[argv.index("--out") + 1], verdict)
    print(f"autotune trial: error: {message}", file=sys.stderr)
    return exit_code_for("error")


def _run_trial(argv: list[str]) -> int:
    try:
        code = worker.main(argv)
    except SystemExit as e:  # argparse errors, sys.exit() in user code
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        # A cold interpreter dies of an unhandled SIGINT by re-raising it: returncode -2.
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    # What a cold interpreter does on its way out (torch's DataLoader and multiprocessing clean-up).
    atexit._run_exitfuncs()
    return code


def _print_exc() -> None:
    try:
        traceback.print_exc()
    except BaseException:  # noqa: BLE001 - stderr may be gone
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass


def base_sys_path() -> list[str]:
    """The interpreter's own sys.path (stdlib, site-packages, .pth entries), without what this server's
    cwd and $PYTHONPATH put in front of it: each child puts its own there."""
    zipped = f"python{sys.version_info[0]}{sys.version_info[1]}.zip"  # always the first stdlib entry
    first = next((i for i, p in enumerate(sys.path) if p.endswith(zipped)), None)
    if first is not None:
        return sys.path[first:]
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in own]


def _child_sys_path(env: Mapping[str, str], base: list[str]) -> list[str]:
    """`python -m` order: the cwd, then $PYTHONPATH (an empty entry is the cwd), then the rest, deduplicated."""
    pythonpath = env.get("PYTHONPATH", "")
    extra = [os.path.abspath(p) if p else os.getcwd() for p in pythonpath.split(os.pathsep)] if pythonpath else []
    return list(dict.fromkeys((os.getcwd(), *extra, *base)))
