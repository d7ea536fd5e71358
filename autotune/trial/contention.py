"""CPU time other processes used while a trial measured: the machine's busy time (/proc/stat) less
the trial's own process tree (its loader workers, and under torchrun every rank and theirs).

On a small machine one busy core of someone else's work makes a step 10-20x slower (two OpenMP
threads wait on a descheduled partner), so a figure measured beside it is not the config's speed.
"""
from __future__ import annotations

import os
import time
from types import TracebackType

import psutil

MIN_WINDOW_S = 1.0  # below this, jiffy-granular counters are noise: nothing is judged


def _busy_s() -> float | None:
    """Seconds of CPU the whole machine spent busy since boot (all CPUs), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _tree_root() -> int:
    # Under torchrun the ranks are torchrun's children: its tree holds the whole trial.
    return os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()


def _tree_s(root: psutil.Process) -> float:
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # a loader worker that just exited: its time is in its parent's children_*
            continue
    return total


class OtherCpu:
    """`with OtherCpu() as m: ...` -> m.cpus: the mean number of CPUs others kept busy, or None."""

    def __init__(self, root_pid: int | None = None) -> None:
        self.cpus: float | None = None
        self._root_pid = root_pid  # whose tree is "the trial" (default: this process, or torchrun's)

    def __enter__(self) -> OtherCpu:
        self._root = psutil.Process(self._root_pid or _tree_root())
        self._busy, self._tree, self._t0 = _busy_s(), _tree_s(self._root), time.monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        wall, busy = time.monotonic() - self._t0, _busy_s()
        if exc_type is None and busy is not None and self._busy is not None and wall >= MIN_WINDOW_S:
            others = (busy - self._busy) - (_tree_s(self._root) - self._tree)
            self.cpus = max(0.0, others / wall)
