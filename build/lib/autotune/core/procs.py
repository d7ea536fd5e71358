"""Process-group helpers shared by the trial launcher, the warm server and stale-trial cleanup."""
from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """If the launcher (or torchrun) dies, take this process with it: no orphan trials."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False when it is already gone (or not ours to signal)."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
