"""Process-group helpers shared by the trial launcher, the warm server and stale-trial cleanup."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterable

# "pid:start-time" of the controller that launched a trial (see process_identity). The launcher puts it in
# every trial's environment, so a process that is started by an intermediary (a torchrun rank) can tell,
# in die_with_parent, whether the controller at the top of the chain is still alive.
CONTROLLER_ENV = "AUTOTUNE_CONTROLLER"


def die_with_parent() -> None:
    """If the launcher (or torchrun) dies, take this process with it: no orphan trials.

    PR_SET_PDEATHSIG only covers a parent that dies after this call. A torchrun rank calls it a moment
    after it started (once its interpreter is up), and torchrun, killed with the controller, may be gone
    by then: the rank would be reparented and run on unwatched. Since the controller's death is what
    kills torchrun, a controller found dead after the prctl means that moment was missed: die now.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    controller = os.environ.get(CONTROLLER_ENV)
    if controller and process_identity(int(controller.split(":", 1)[0])) != controller:
        os.kill(os.getpid(), signal.SIGKILL)  # what PR_SET_PDEATHSIG would have done


def process_identity(pid: int) -> str | None:
    """ "pid:start-time" of a live process (None if it is gone or a zombie): unlike a bare pid, this
    never names a later process that happens to reuse the number."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces or ')'
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: dead to us
        return None
    return f"{pid}:{fields[19]}"  # field 22 of proc(5), starttime in clock ticks since boot


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False when it is already gone (or not ours to signal)."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_groups(pgids: Iterable[int], sig: int = signal.SIGKILL) -> list[int]:
    """Signal each of these process groups (never this process's own); returns the ones that still existed."""
    own = os.getpgid(0)
    return [g for g in dict.fromkeys(pgids) if g > 1 and g != own and signal_group(g, sig)]


def exit_now(code: int) -> None:
    """End a failed DDP rank at once, its verdict already written. Its peers wait for it in a collective,
    and an ordinary interpreter exit can block (NCCL's process-group teardown waiting on its watchdog,
    a thread left running): they would hang until a timeout. Once this process is gone, torchrun sees
    the failure and tears the other ranks down (and itself exits 1, whatever this code: the verdict file
    is what carries the cause)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
