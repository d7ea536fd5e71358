"""One machine, several searches: trials must not share a GPU, and CPU sharing must be known.

A GPU trial takes an exclusive flock per device it uses (blocking), so concurrent searches on one
machine take turns. CPUs cannot be partitioned that way without starving a search, so every trial
(a GPU trial too: its data loaders and Python threads run on the CPUs) takes a shared lease on each
CPU it may run on (its affinity, which `--cpus` sets and trials inherit), and a trial whose lease
overlapped another's on any CPU is flagged `contended`: its timing is suspect. Workers given disjoint
CPUs (one per GPU, each with its own share) never contend.

Overlap is seen from both sides, however the two nest, per CPU (cpu-<n>.lock):
  * at acquisition: another lease is held now (flock: a crashed holder's lease goes with its process);
  * at release: another lease began since ours did. Each acquisition appends one byte to the file,
    so a lease remembers the file's size and compares at release. Acquisition and release each run
    under cpu.mutex, so no lease can start between another's two checks; a file is emptied when
    its last holder leaves, so it stays a few bytes long.
The folder is shared by every user's searches, like /tmp: mode 1777, lock files 0666.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.trial.processes import launcher
from autotune.trial.measurement.contention import allotted_cpus
from autotune.trial.processes.placement import Placement
from autotune.trial.processes.torchx_nodes import LOCAL

DEFAULT_LOCK_DIR = "/tmp/autotune-locks"


def lock_dir() -> Path:
    d = Path(os.environ.get("AUTOTUNE_LOCK_DIR", DEFAULT_LOCK_DIR))
    if not d.is_dir():
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            d.mkdir()
        except FileExistsError:
            return d  # another search made it (and set its mode) in between
        # Another user's search must add its own lock files here, and none may delete another's.
        # chmod, because mkdir's mode is cut by the umask.
        os.chmod(d, 0o1777)
    elif str(d) == DEFAULT_LOCK_DIR and d.stat().st_uid == os.geteuid() and d.stat().st_mode & 0o1777 != 0o1777:
        os.chmod(d, 0o1777)  # ours, made before the folder was shared: open it up (a private folder is left alone)
    return d


def _open(name: str) -> int:
    """A lock file in lock_dir() that every user can open and write (0666)."""
    path = lock_dir() / name
    while True:
        try:
            # Open an existing file without O_CREAT: with fs.protected_regular (systemd's default), an
            # O_CREAT open of another user's file in a sticky world-writable folder fails, even for 0666.
            return os.open(path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another search created it in between: open theirs
        os.fchmod(fd, 0o666)  # the umask cut open()'s mode
        return fd


def _file_name(device_id: str) -> str:
    # Old-style MIG UUIDs ("MIG-GPU-<uuid>/<gi>/<ci>") contain slashes.
    return "gpu-" + device_id.replace("/", "_") + ".lock"


@functools.lru_cache(maxsize=1)
def _cuda_devices() -> tuple[str, ...]:
    """This process's CUDA devices, named so that every search names a physical device alike: by
    UUID, whether CUDA_VISIBLE_DEVICES says "0" or "GPU-<uuid>" (or a prefix of it)."""
    import torch

    if not torch.cuda.is_available():
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    # Lock physical devices: two searches with different CUDA_VISIBLE_DEVICES must not collide by index.
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    return tuple(_uuids(ids))


def _uuids(ids: list[str]) -> list[str]:
    """NVML's UUID for each id. Without NVML the ids stay as given: asking CUDA instead would
    initialise it in the controller, which must not hold a context on the GPUs its trials measure.
    Then "0" and "GPU-<uuid>" for one GPU do not exclude each other; searches that name their GPUs
    alike (the usual case: all by index, or all by UUID) still do."""
    from autotune.trial.measurement.measure import handle_for, nvml, text  # lazy: torch, only once a GPU is locked

    pynvml = nvml()
    if pynvml is None:
        return ids
    out = []
    for i in ids:
        try:
            out.append(text(pynvml.nvmlDeviceGetUUID(_cuda_slice(pynvml, handle_for(pynvml, i)))))
        except Exception:  # an id NVML does not know (not an index, an ambiguous prefix): keep it
            out.append(i)
    return out


def _cuda_slice(pynvml: Any, handle: Any) -> Any:
    """The device CUDA really runs on for this NVML handle. With MIG on, CUDA runs on a slice, never on
    the GPU itself, and one process sees a single slice: a search that names the GPU (by index, as every
    search does with CUDA_VISIBLE_DEVICES unset, or by its GPU- UUID) gets the GPU's first slice. It
    locks that slice's UUID, the one a search given "MIG-<uuid>" of that slice locks, so the two exclude
    each other. A search given another slice's UUID runs beside them, as MIG means it to."""
    try:
        if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
            return handle
        current = pynvml.nvmlDeviceGetMigMode(handle)[0]
    except pynvml.NVMLError:  # MIG not supported (pre-Ampere, a consumer GPU): the GPU itself
        return handle
    if not current:
        return handle
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except pynvml.NVMLError:  # NOT_FOUND: no slice at this index (slices may be sparse)
            continue
    return handle  # MIG on but no slice made: CUDA can run nothing here; the GPU's UUID names it


@dataclass
class Lease:
    contended: bool = False  # another trial used this machine's CPUs while this one ran


def _alone(fd: int) -> bool:
    try:  # an exclusive lock is only granted when no other trial holds its shared one
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def _mutex() -> Iterator[None]:
    fd = _open("cpu.mutex")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for microseconds: the checks below, never a trial
        yield
    finally:
        os.close(fd)  # closing releases the flock


def cpu_file(cpu: int) -> str:
    return f"cpu-{cpu}.lock"


def _lease_cpus() -> list[int]:
    """The CPUs this process's trials run on: its affinity, which they inherit."""
    cpus = allotted_cpus()
    return sorted(cpus) if cpus else list(range(os.cpu_count() or 1))


@contextlib.contextmanager
def _cpu_lease(lease: Lease) -> Iterator[None]:
    fds: list[int] = []
    marks: list[int] = []
    try:
        for cpu in _lease_cpus():
            fds.append(_open(cpu_file(cpu)))
        with _mutex():
            # Every CPU is tried (no short cut): each exclusive try that succeeds becomes the shared lock.
            lease.contended = not all([_alone(fd) for fd in fds])
            for fd in fds:
                fcntl.flock(fd, fcntl.LOCK_SH)  # seen by every lease on this CPU that starts while this one runs
                os.write(fd, b"+")  # O_APPEND: one byte per acquisition
                marks.append(os.fstat(fd).st_size)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    try:
        yield
    finally:
        with _mutex():
            for fd, mark in zip(fds, marks):
                lease.contended |= os.fstat(fd).st_size > mark  # another lease on this CPU began meanwhile
                if _alone(fd):  # its last holder: no mark is left to compare with
                    os.ftruncate(fd, 0)
                os.close(fd)


@contextlib.contextmanager
def device_lock(gpus: int) -> Iterator[Lease]:
    """Hold the devices a trial of `gpus` processes uses (GPUs), and share the CPUs knowingly."""
    devices = _cuda_devices()
    lease = Lease()
    fds: list[int] = []
    try:
        for dev in sorted(devices[: _devices_used(gpus)]) if devices else ():  # sorted: no deadlock between searches
            fds.append(_open(_file_name(dev)))
            fcntl.flock(fds[-1], fcntl.LOCK_EX)
        with _cpu_lease(lease):  # after the GPUs: a trial waiting for its turn is not using the CPUs
            yield lease
    finally:
        for fd in fds:
            os.close(fd)  # closing releases the flock


def _devices_used(gpus: int) -> int:
    """How many of this process's GPUs a trial of `gpus` ranks per node takes: nodes that TorchX's
    local_cwd simulates here each take `gpus` of them, in order (trial/processes/torchx_nodes.py)."""
    placement = Placement.from_env()
    nodes = placement.nodes if placement.launcher == "torchx" and placement.scheduler == LOCAL else 1
    return max(1, gpus) * nodes


def locked_trial(cfg: TrialConfig, trial_dir: Path, timeout_s: float, **launch: Any) -> tuple[TrialResult, Lease]:
    """launcher.run_trial holding the devices `cfg` uses: every trial a search starts (its trials,
    confirmation's rounds, parity's runs) goes through here, so no two share a GPU. `launch`: the
    launcher's keywords (server, on_window, on_start, on_groups). Returns the result and the lease,
    which says whether another trial shared the CPUs meanwhile."""
    with device_lock(cfg.gpus) as lease:
        return launcher.run_trial(cfg, trial_dir, timeout_s, **launch), lease
