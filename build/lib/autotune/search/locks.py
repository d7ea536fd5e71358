"""One machine, several searches: trials must not share a GPU, and CPU sharing must be known.

A GPU trial takes an exclusive flock per device it uses (blocking), so concurrent searches on one
machine take turns. CPU trials cannot be partitioned that way without starving a search, so they
run, but a trial that overlapped another is flagged `contended`: its timing is suspect.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator


def lock_dir() -> Path:
    d = Path(os.environ.get("AUTOTUNE_LOCK_DIR", "/tmp/autotune-locks"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@functools.lru_cache(maxsize=1)
def _cuda_devices() -> tuple[str, ...]:
    import torch

    if not torch.cuda.is_available():
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    # Lock physical devices: two searches with different CUDA_VISIBLE_DEVICES must not collide by index.
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    return tuple(ids)


@dataclass
class Lease:
    contended: bool = False  # another trial ran on this CPU at the start or the end of this one


def _alone(f: IO[str]) -> bool:
    try:  # an exclusive lock is only granted when no other trial holds its shared one
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def device_lock(gpus: int) -> Iterator[Lease]:
    """Hold the devices a trial of `gpus` processes uses (GPUs), or share the CPU knowingly."""
    devices = _cuda_devices()
    lease = Lease()
    files: list[IO[str]] = []
    try:
        if devices:
            for dev in sorted(devices[: max(1, gpus)]):  # sorted: no deadlock between searches
                f = (lock_dir() / f"gpu-{dev}.lock").open("w")
                fcntl.flock(f, fcntl.LOCK_EX)
                files.append(f)
            yield lease
            return
        f = (lock_dir() / "cpu.lock").open("w")
        files.append(f)
        lease.contended = not _alone(f)
        fcntl.flock(f, fcntl.LOCK_SH)  # seen by any trial that starts or ends while this one runs
        yield lease
        lease.contended |= not _alone(f)
    finally:
        for f in files:
            f.close()  # closing releases the flock
