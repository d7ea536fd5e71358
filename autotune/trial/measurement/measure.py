"""Honest clocks: synchronize before reading, account data waits, sample GPU utilisation (NVML)."""

from __future__ import annotations

import os
import re
import resource
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import torch


def sync(device: torch.device) -> None:
    # Kernels run asynchronously: a clock read without a sync times the launch, not the work.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak over, at the timed window's start. CUDA: the caching allocator's free cached blocks are
    handed back first (empty_cache): reset_peak_memory_stats sets the peak to what is reserved *now*, and
    without it the warm-up's freed workspaces (cuDNN's benchmark of every algorithm, max-autotune's
    candidate kernels) would stay reserved and count in every trial's peak, a memory it does not need
    (the allocator frees cached blocks and retries before it reports an out-of-memory). The timed steps
    reserve again what they use: the first one pays that cudaMalloc, a few ms in a window of seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # blocks a running kernel still uses are not free to hand back
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the most the caching allocator *reserved* since reset_peak_memory (what the device really had
    to give; allocated is less, and a config near the limit fails on reserved). CPU: this process's peak
    RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def memory_total_bytes(device: torch.device) -> int | None:
    """What the peak is held against for the headroom rule. CUDA: the device's total memory. CPU: the
    RAM this process could still have had when it started measuring (MemAvailable plus its own RSS)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
        available = int(meminfo["MemAvailable"].split()[0]) * 1024
        rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, KeyError, ValueError, IndexError):  # not Linux: no headroom figure
        return None
    return available + rss


# ------------------------------------------------------------------------------------------ NVML
# NVML numbers GPUs in PCI order, whatever CUDA_VISIBLE_DEVICES says; CUDA numbers the visible ones
# from 0. Everything below maps a CUDA device to its NVML handle, by UUID where possible. The search
# side (locks, fingerprint, warm start) uses these too, and must do it without initialising CUDA.


def nvml() -> Any:
    """pynvml, initialised; None without it or without a driver (no GPU, a container without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def text(value: Any) -> str:
    """NVML strings: nvidia-ml-py decodes them, older pynvml returned bytes (str() would give "b'...'")."""
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it (torch.cuda._parse_visible_devices): indices, or UUIDs
    (GPU-/MIG-, prefixes allowed); it stops at the first entry it cannot read, and a repeated entry
    hides every device. None: unset, every device is visible."""
    var = os.environ.get("CUDA_VISIBLE_DEVICES")
    if var is None:
        return None
    out: list[str] = []
    uuids = var.strip().startswith(("GPU-", "MIG-"))
    for entry in (e.strip() for e in var.split(",")):
        if uuids != entry.startswith(("GPU-", "MIG-")):
            break
        if not uuids:
            digits = re.match(r"\+?\d+", entry)  # strtoul: "1gpu" is 1
            if digits is None:
                break
            entry = str(int(digits.group()))
        if entry in out:
            return []
        out.append(entry)
    return out


def handle_for(pynvml: Any, entry: str) -> Any:
    """The NVML handle of one CUDA_VISIBLE_DEVICES entry. An index is taken as NVML's index, as torch
    does (torch.cuda._get_nvml_device_index): CUDA's default order is fastest-first, NVML's is PCI,
    and the two agree unless the GPUs differ in speed (CUDA_DEVICE_ORDER=PCI_BUS_ID makes it exact)."""
    if not entry.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(entry)
    except pynvml.NVMLError:
        if entry.startswith("MIG-"):
            raise
    # CUDA also takes an unambiguous UUID prefix ("GPU-8932f937"): find the one GPU it names.
    found = [
        h
        for h in map(pynvml.nvmlDeviceGetHandleByIndex, range(pynvml.nvmlDeviceGetCount()))
        if text(pynvml.nvmlDeviceGetUUID(h)).startswith(entry)
    ]
    if len(found) != 1:
        raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry} names {len(found)} GPUs")
    return found[0]


def visible_handles(pynvml: Any) -> list[Any]:
    """NVML handles of this process's CUDA devices, in CUDA's order, without initialising CUDA."""
    entries = visible_devices()
    if entries is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    return [handle_for(pynvml, e) for e in entries]


def device_handle(pynvml: Any, index: int) -> Any:
    """The NVML handle of torch's cuda:`index`. Its UUID is exact (any order, MIG slices too); the
    CUDA_VISIBLE_DEVICES mapping is the fallback. A trial process has initialised CUDA already."""
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)  # "58b2e1b9-...", no prefix
    except Exception:  # a torch without .uuid, or CUDA not usable here
        uuid = ""
    if uuid:
        for name in [uuid] if uuid.startswith(("GPU-", "MIG-")) else ["GPU-" + uuid, "MIG-" + uuid]:
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError:  # NOT_FOUND: the other prefix, or a driver that can't look it up
                continue
    entries = visible_devices()
    return pynvml.nvmlDeviceGetHandleByIndex(index) if entries is None else handle_for(pynvml, entries[index])


# NVML lists the pids the driver records, the initial (the host's) pid namespace's: in a container with its
# own pid namespace they are not os.getpid(). The kernel numbers the initial pid namespace PROC_PID_INIT_INO.
INIT_PID_NAMESPACE = "pid:[4026531836]"
PROC_SELF = Path("/proc/self")
PID_NAMESPACE = (
    "pid namespace: this process runs in a pid namespace of its own (a container) and NVML's pids are the "
    "host's, which its /proc does not show: NVML cannot name this process"
)


def nvml_pid() -> tuple[int | None, str | None]:
    """This process's pid as NVML lists it, or None and why it cannot be known. In the initial pid namespace
    it is os.getpid(); in another, the outermost pid /proc/self/status's NSpid shows (the host's, where
    /proc is mounted from the host's namespace), else unknown: a container's own /proc shows only its own."""
    try:
        namespace = os.readlink(PROC_SELF / "ns" / "pid")
    except OSError:  # no /proc (not Linux): no pid namespaces to tell apart
        return os.getpid(), None
    if namespace == INIT_PID_NAMESPACE:
        return os.getpid(), None
    try:
        status = (PROC_SELF / "status").read_text().splitlines()
    except OSError:
        status = []
    nspid = next((line.split()[1:] for line in status if line.startswith("NSpid:")), [])
    if len(nspid) > 1:
        return int(nspid[0]), None
    return None, PID_NAMESPACE


# Under MIG, NVML keeps no utilisation counter for a slice, nor for its GPU while MIG mode is on:
# nvmlDeviceGetUtilizationRates answers NOT_SUPPORTED every time. That is not an error to count.
MIG_NO_UTILISATION = (
    "n/a under MIG: NVML keeps no utilisation counter for a MIG slice or a GPU in MIG mode "
    "(nvmlDeviceGetUtilizationRates answers NOT_SUPPORTED)"
)
NVML_ERROR_NOT_SUPPORTED = 3  # pynvml's value; a fake or an old pynvml may not name it


def in_mig_mode(pynvml: Any, handle: Any) -> bool:
    """A MIG slice's handle, or a GPU whose current MIG mode is on; False where NVML cannot say."""
    try:
        if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
            return True
    except Exception:  # a driver or pynvml without MIG calls: no MIG
        return False
    try:
        return int(pynvml.nvmlDeviceGetMigMode(handle)[0]) == 1  # [current, pending]; 1 = NVML_DEVICE_MIG_ENABLE
    except Exception:  # NOT_SUPPORTED: a GPU without MIG
        return False


class GpuUtilSampler:
    """Background NVML sampling of this process's GPU; a no-op (mean None) without a GPU.

    Each rank of a multi-GPU trial samples its own device in its own process. An NVML error costs
    that sample only: `errors` counts them and `first_error` says what went wrong (also why nothing
    was sampled at all: the device has no NVML handle, or it is under MIG, where NVML has no
    utilisation to give: then `first_error` is MIG_NO_UTILISATION and nothing is counted)."""

    def __init__(self, device: torch.device, interval_s: float = 0.1) -> None:
        self.samples: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._sampling = False
        self.uuid: str | None = None
        if device.type != "cuda":
            return
        pynvml = nvml()
        if pynvml is None:  # no driver / no NVML: utilisation is simply unknown
            self.first_error = "NVML unavailable"
            return
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._handle = device_handle(pynvml, index)
        except Exception as e:
            self.first_error = f"no NVML handle for {device}: {e}"
            return
        try:  # which GPU is sampled, for the log: its absence costs no sample
            self.uuid = text(pynvml.nvmlDeviceGetUUID(self._handle))
        except Exception:
            self.uuid = None
        if in_mig_mode(pynvml, self._handle):
            self.first_error = MIG_NO_UTILISATION
            return
        self._sampling = True

    def _run(self) -> None:
        import pynvml

        not_supported = getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)
        while not self._stop.wait(self._interval):
            try:
                self.samples.append(float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except pynvml.NVMLError as e:  # a transient failure (or a lost GPU) costs this sample only
                if getattr(e, "value", None) == not_supported and not self.samples:
                    # Never supported on this device (MIG mode switched on where NVML's answer above
                    # missed it): the same answer every time, not a sample lost.
                    self.first_error = f"n/a: NVML does not report utilisation for this device ({e})"
                    return
                self._error(e)
            except Exception as e:  # anything else is not NVML's answer: record it, stop, stay quiet
                self._error(e)
                return

    def _error(self, e: Exception) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(e).__name__}: {e}"

    def compute_pids(self) -> tuple[list[int] | None, str | None]:
        """The pids NVML lists with a compute context on the sampled device (and why not, when it
        cannot say): the proof that the device sampled is the one this process computes on. NVML
        gives host pids: in a container with its own pid namespace they are not this process's (nvml_pid
        is the one to look for among them)."""
        if self._handle is None:
            return None, self.first_error or "no NVML handle"
        try:
            import pynvml

            return sorted(int(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)), None
        except Exception as e:  # an old driver without the call, or NVML refusing a MIG slice
            return None, f"{type(e).__name__}: {e}"

    def __enter__(self) -> GpuUtilSampler:
        if self._sampling:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
