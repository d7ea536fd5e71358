"""How many CPUs this process may really use: the affinity mask and the container's CPU quota.

Shared by the search (sizing loader workers against the hardware) and the trial (each DDP rank's thread
share), so both count the same CPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

# Where the cgroup filesystem is mounted. Inside a container this is the container's own cgroup, whose
# quota is the one that throttles it: v2 "cpu.max", v1 "cpu/cpu.cfs_quota_us" + "cpu/cpu.cfs_period_us".
CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup: Path | None = None) -> int:
    """CPUs this process may use: os.cpu_count() counts the machine, not the affinity mask (taskset,
    Slurm) nor the container's CPU quota (an 8-CPU pod on a 64-core host sees 64), so what is sized by
    it oversubscribes."""
    n = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    quota = cpu_quota(CGROUP_ROOT if cgroup is None else cgroup)
    return n if quota is None else max(1, min(n, quota))


def cpu_quota(cgroup: Path) -> int | None:
    """The cgroup's CPU quota in whole CPUs, rounded up (1.5 CPUs: 2, as Go counts); None without one."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "<quota> <period>"
        return None if quota == "max" else -(-int(quota) // int(period))
    except (OSError, ValueError, ZeroDivisionError):
        pass  # no cgroup v2 quota here: perhaps v1
    try:
        q = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())  # v1: -1 for none
        per = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 else -(-q // per)
    except (OSError, ValueError, ZeroDivisionError):
        return None
