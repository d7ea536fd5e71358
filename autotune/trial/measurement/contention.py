"""CPU time other processes used while a trial measured: the machine's busy time (/proc/stat) less
the trial's own process tree (its loader workers, and under torchrun every rank and theirs).

On a small machine one busy core of someone else's work makes a step many times slower (two OpenMP
threads wait on a descheduled partner; benchmarks/README.md has the figure), so a figure measured beside
it is not the config's speed.

Only the CPUs the trial may run on count (its affinity: a worker pinned with --cpus passes it on). On a
machine shared by one worker per GPU, each on its own CPUs, the neighbours' steady use is elsewhere and
does not make every trial contended; unpinned, every CPU is the trial's, and every busy one counts.
"""

from __future__ import annotations

import os
import time
from types import TracebackType

import psutil

MIN_WINDOW_S = 1.0  # below this, jiffy-granular counters are noise: nothing is judged


def _busy_s(cpus: frozenset[int] | None = None) -> float | None:
    """Seconds of CPU spent busy since boot on `cpus` (every CPU when None), or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu")]
    except OSError:
        return None
    try:
        rows = [lines[0][1:]] if cpus is None else [ln[1:] for ln in lines[1:] if int(ln[0][3:]) in cpus]
        total = 0
        for row in rows:
            user, nice, system, _idle, _iowait, irq, softirq, steal = ([int(x) for x in row] + [0] * 8)[:8]
            total += user + nice + system + irq + softirq + steal
    except (IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def allotted_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on, or None where the OS does not say (every CPU, then)."""
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


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
        self._cpus = allotted_cpus()
        self._busy, self._tree, self._t0 = _busy_s(self._cpus), _tree_s(self._root), time.monotonic()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        wall, busy = time.monotonic() - self._t0, _busy_s(self._cpus)
        if exc_type is None and busy is not None and self._busy is not None and wall >= MIN_WINDOW_S:
            others = (busy - self._busy) - (_tree_s(self._root) - self._tree)
            self.cpus = max(0.0, others / wall)
