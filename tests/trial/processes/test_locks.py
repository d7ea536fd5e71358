"""autotune/trial/processes/locks.py: GPU trials take turns per physical device; CPU trials overlap, but know it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Iterator

import pytest
import torch

from autotune.trial.processes import locks
from autotune.trial.processes.placement import Placement
from tests.fakes import UUID_A, UUID_B, FakeGpu, FakeNvml

REPO_ROOT = Path(__file__).resolve().parents[3]
REAL_CUDA_DEVICES = locks._cuda_devices  # cached: cleared around every test


@pytest.fixture(autouse=True)
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own lock folder (two tests must never see each other's leases)."""
    d = tmp_path / "nested" / "locks"
    monkeypatch.setenv("AUTOTUNE_LOCK_DIR", str(d))
    REAL_CUDA_DEVICES.cache_clear()
    yield d
    REAL_CUDA_DEVICES.cache_clear()  # a list read under a faked torch.cuda must not outlive the test


def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locks, "_cuda_devices", lambda: ())


def gpus(monkeypatch: pytest.MonkeyPatch, *ids: str) -> None:
    monkeypatch.setattr(locks, "_cuda_devices", lambda: tuple(ids))


def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_fails=True))


def two_cuda_gpus(monkeypatch: pytest.MonkeyPatch, visible: str | None) -> FakeNvml:
    """A machine with two GPUs that NVML knows by UUID; this search sees `visible` of them."""
    fake = FakeNvml([FakeGpu(UUID_A), FakeGpu(UUID_B)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if visible is None else len(visible.split(",")))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    REAL_CUDA_DEVICES.cache_clear()
    return fake


class Holder:
    """device_lock held in another thread until released: a second search's trial on this machine."""

    def __init__(self, n_gpus: int = 1) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.lease: locks.Lease | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(n_gpus,), daemon=True)
        self.thread.start()

    def _run(self, n_gpus: int) -> None:
        try:
            with locks.device_lock(n_gpus) as lease:
                self.lease = lease
                self.entered.set()
                self.release.wait(30)
        except BaseException as e:  # pragma: no cover - reported by the test
            self.error = e
            self.entered.set()

    def finish(self) -> locks.Lease:
        self.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive() and self.error is None, self.error
        assert self.lease is not None
        return self.lease


# --- the lock folder ------------------------------------------------------------------------------


def test_lock_dir_is_created_where_the_environment_says(lock_dir: Path) -> None:
    assert not lock_dir.exists()
    assert locks.lock_dir() == lock_dir
    assert lock_dir.is_dir()
    assert locks.lock_dir() == lock_dir  # a second call on an existing folder is fine


def cpu_lock_files(lock_dir: Path) -> list[Path]:
    """One lease file per CPU this process may run on."""
    return [lock_dir / locks.cpu_file(c) for c in sorted(os.sched_getaffinity(0))]


def test_cpu_lease_uses_the_lock_folder(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    with locks.device_lock(1):
        assert all(f.is_file() for f in cpu_lock_files(lock_dir))


# --- CPU: overlap is allowed, and flagged ---------------------------------------------------------


def test_a_lone_cpu_lease_is_not_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    with locks.device_lock(1) as lease:
        assert lease.contended is False
    assert lease.contended is False
    with locks.device_lock(1) as again:  # one after the other: still alone
        pass
    assert again.contended is False


def test_overlapping_cpu_leases_are_both_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    first = Holder()
    assert first.entered.wait(10)
    assert first.lease is not None and first.lease.contended is False  # it started alone
    t0 = time.monotonic()
    with locks.device_lock(1) as second:
        assert second.contended is True  # started while the other one ran
        assert time.monotonic() - t0 < 5  # CPU trials are not serialized
        lease = first.finish()  # the other one ends while this one runs
    assert lease.contended is True  # it ended while this one ran
    assert second.contended is True


def test_cpu_lease_contended_at_its_end_only(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    with locks.device_lock(1) as lease:
        assert lease.contended is False
        other = Holder()  # another trial starts while this one runs, and outlives it
        assert other.entered.wait(10)
        assert other.lease is not None and other.lease.contended is True
    assert lease.contended is True
    other.finish()


def test_cpu_lease_seen_across_processes(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two searches are two processes: the lease must be visible to another process, not just a thread."""
    cpu_only(monkeypatch)
    other = PinnedSearch(lock_dir, set(os.sched_getaffinity(0)))  # on this process's CPUs
    try:
        assert other.line() == ["in", "False"]
        with locks.device_lock(1) as lease:
            assert lease.contended is True
            assert other.release() == ["out", "True"]  # it ended while this one ran
    finally:
        other.kill()
    with locks.device_lock(1) as alone:  # the other process is gone: alone again
        pass
    assert alone.contended is False


class PinnedSearch:
    """Another search's controller in its own process, pinned to `cpus` (as `--cpus` pins a worker),
    holding a CPU lease until told to let go."""

    CODE = (
        "import os, sys\n"
        "os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
        "from autotune.trial.processes import locks\n"
        "locks._cuda_devices = lambda: ()\n"
        "with locks.device_lock(1) as lease:\n"
        "    print('in', lease.contended, flush=True)\n"
        "    sys.stdin.readline()\n"
        "print('out', lease.contended, flush=True)\n"
    )

    def __init__(self, lock_dir: Path, cpus: set[int]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "AUTOTUNE_LOCK_DIR": str(lock_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE, ",".join(map(str, sorted(cpus)))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def line(self) -> list[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().split()

    def release(self) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        out = self.line()
        assert self.proc.wait(30) == 0
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def two_cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to pin two searches apart")
    return cpus[0], cpus[1]


def test_searches_on_disjoint_cpus_do_not_contend(lock_dir: Path, two_cpus: tuple[int, int]) -> None:
    """One worker per GPU, each given its own CPUs (--cpus): both hold leases at once, neither contended."""
    a, b = two_cpus
    first, second = PinnedSearch(lock_dir, {a}), PinnedSearch(lock_dir, {b})
    try:
        assert first.line() == ["in", "False"]
        assert second.line() == ["in", "False"]  # started while the first one ran, on other CPUs
        assert first.release() == ["out", "False"]  # ended while the second one ran
        assert second.release() == ["out", "False"]
    finally:
        first.kill()
        second.kill()


def test_searches_on_overlapping_cpus_contend(lock_dir: Path, two_cpus: tuple[int, int]) -> None:
    a, b = two_cpus
    first, second = PinnedSearch(lock_dir, {a}), None
    try:
        assert first.line() == ["in", "False"]
        second = PinnedSearch(lock_dir, {a, b})  # shares CPU a with the first
        assert second.line() == ["in", "True"]
        assert first.release() == ["out", "True"]
        assert second.release() == ["out", "True"]
    finally:
        first.kill()
        if second is not None:
            second.kill()


# --- GPU: exclusive per physical device ------------------------------------------------------------


def test_gpu_leases_on_the_same_device_take_turns(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, "0")
    with locks.device_lock(1) as lease:
        assert lease.contended is False  # a GPU is held exclusively: never shared
        assert (lock_dir / "gpu-0.lock").is_file()
        waiting = Holder()
        assert not waiting.entered.wait(0.5)  # blocked while this trial holds the device
    assert waiting.entered.wait(10)  # and it runs as soon as the device is free
    assert waiting.finish().contended is False


def test_gpu_leases_on_different_devices_run_together(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, "0")  # one search sees only physical GPU 0 ...
    with locks.device_lock(1):
        gpus(monkeypatch, "1")  # ... another only physical GPU 1
        other = Holder()
        assert other.entered.wait(5)
        other.finish()


def test_multi_gpu_lease_waits_for_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, "1")
    with locks.device_lock(1):
        gpus(monkeypatch, "0", "1")
        both = Holder(n_gpus=2)  # needs GPU 1 too
        assert not both.entered.wait(0.5)
    assert both.entered.wait(10)
    both.finish()


def test_nodes_simulated_here_hold_every_gpu_they_take(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchX's local_cwd runs each node on this machine, on GPUs of its own: a trial of 1 GPU per node on
    2 nodes takes this process's first 2 GPUs, and holds both."""
    gpus(monkeypatch, "0", "1", "2")
    for key, value in Placement(2, "torchx", "local_cwd").to_env().items():
        monkeypatch.setenv(key, value)
    with locks.device_lock(1):
        assert sorted(p.name for p in lock_dir.glob("gpu-*")) == ["gpu-0.lock", "gpu-1.lock"]


def test_cuda_device_list_names_physical_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)  # without NVML the ids stay CUDA_VISIBLE_DEVICES's own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert locks._cuda_devices() == ("0", "1")
    locks._cuda_devices.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")  # indices 0 and 1 of this process are GPUs 3 and 5
    assert locks._cuda_devices() == ("3", "5")


def test_visible_devices_of_two_searches_do_not_collide(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with locks.device_lock(1):
        assert (lock_dir / "gpu-3.lock").is_file() and not (lock_dir / "gpu-0.lock").exists()


def test_no_cuda_means_a_cpu_lease(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # set, but there is no device
    with locks.device_lock(1):
        assert not any(p.name.startswith("gpu-") for p in lock_dir.iterdir())
        assert all(f.is_file() for f in cpu_lock_files(lock_dir))


# --- one physical GPU, however a search names it ---------------------------------------------------


@pytest.mark.parametrize(
    "visible, want",
    [
        (None, (UUID_A, UUID_B)),
        ("1", (UUID_B,)),
        (UUID_B, (UUID_B,)),
        (UUID_B[:12], (UUID_B,)),  # CUDA takes an unambiguous UUID prefix
        ("1,0", (UUID_B, UUID_A)),
    ],
)
def test_devices_are_named_by_uuid(monkeypatch: pytest.MonkeyPatch, visible: str | None, want: tuple[str, ...]) -> None:
    two_cuda_gpus(monkeypatch, visible)
    assert locks._cuda_devices() == want


def test_same_gpu_by_index_and_by_uuid_excludes(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two_cuda_gpus(monkeypatch, "1")  # one search names NVML's GPU 1 by index ...
    with locks.device_lock(1):
        two_cuda_gpus(monkeypatch, UUID_B)  # ... another by its UUID
        waiting = Holder()
        assert not waiting.entered.wait(0.5)  # the same device: it waits its turn
        assert [p.name for p in lock_dir.glob("gpu-*")] == [f"gpu-{UUID_B}.lock"]
    assert waiting.entered.wait(10)
    waiting.finish()


def test_other_gpu_by_uuid_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    two_cuda_gpus(monkeypatch, "1")
    with locks.device_lock(1):
        two_cuda_gpus(monkeypatch, UUID_A)
        other = Holder()
        assert other.entered.wait(5)
        other.finish()


MIG_0 = "MIG-5c4d3e2f-cccc-4a5b-8c7d-222222222222"
MIG_1 = "MIG-9e8d7c6b-dddd-4f0e-8a9b-333333333333"


def mig_gpu(monkeypatch: pytest.MonkeyPatch, visible: str | None) -> None:
    """One GPU in MIG mode with two slices; this search sees `visible` (None: CUDA_VISIBLE_DEVICES unset)."""
    gpu = FakeGpu(UUID_A, mig_mode=1)
    monkeypatch.setitem(
        sys.modules, "pynvml", FakeNvml([gpu], slices=(FakeGpu(MIG_0, parent=gpu), FakeGpu(MIG_1, parent=gpu)))
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one process sees one MIG slice
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    REAL_CUDA_DEVICES.cache_clear()


@pytest.mark.parametrize(
    "visible, want", [(None, MIG_0), ("0", MIG_0), (UUID_A, MIG_0), (MIG_0, MIG_0), (MIG_1, MIG_1)]
)
def test_under_mig_the_gpu_is_named_by_the_slice_cuda_runs_on(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, want: str
) -> None:
    mig_gpu(monkeypatch, visible)
    assert locks._cuda_devices() == (want,)


def test_under_mig_an_unset_search_and_a_slice_search_exclude(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mig_gpu(monkeypatch, None)  # one search leaves CUDA_VISIBLE_DEVICES unset ...
    with locks.device_lock(1):
        mig_gpu(monkeypatch, MIG_0)  # ... another names the slice that CUDA gives the first
        waiting = Holder()
        assert not waiting.entered.wait(0.5)
        assert [p.name for p in lock_dir.glob("gpu-*")] == [f"gpu-{MIG_0}.lock"]
    assert waiting.entered.wait(10)
    waiting.finish()


def test_a_gpu_without_mig_support_is_named_by_its_own_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(UUID_A, mig_mode=None)]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert locks._cuda_devices() == (UUID_A,)


def test_old_style_mig_uuid_is_a_file_name(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, f"MIG-{UUID_A}/1/0")  # R450-era MIG UUIDs name the instance with slashes
    with locks.device_lock(1):
        assert (lock_dir / f"gpu-MIG-{UUID_A}_1_0.lock").is_file()


# --- the folder is shared by every user -------------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # the usual umask: what mkdir/open alone would leave is not shareable
    yield
    os.umask(old)


def test_lock_folder_is_world_writable_and_sticky(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    locks.lock_dir()
    mode = os.stat(lock_dir).st_mode
    assert stat.S_IMODE(mode) == 0o1777 and mode & stat.S_ISVTX
    gpus(monkeypatch, "0")
    with locks.device_lock(1):
        pass
    for path in [*cpu_lock_files(lock_dir), lock_dir / "cpu.mutex", lock_dir / "gpu-0.lock"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666, path


def test_a_folder_someone_chose_is_left_as_it_is(lock_dir: Path, umask_022: None) -> None:
    lock_dir.mkdir(parents=True, mode=0o700)  # AUTOTUNE_LOCK_DIR: a private folder, on purpose
    locks.lock_dir()
    assert stat.S_IMODE(os.stat(lock_dir).st_mode) == 0o700


def test_lock_files_of_another_user_are_opened_without_o_creat(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fs.protected_regular refuses an O_CREAT open of another user's file in a sticky folder: an
    existing lock file must be opened without it."""
    cpu_only(monkeypatch)
    with locks.device_lock(1):  # creates the files
        pass
    real_open = os.open

    def protected(path: object, flags: int, *args: object) -> int:
        if flags & os.O_CREAT and os.path.exists(str(path)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", protected)
    with locks.device_lock(1) as lease:
        pass
    assert lease.contended is False


# --- GPU trials share the CPUs: their contention is metered too --------------------------------------


def test_a_gpu_lease_overlapped_by_a_cpu_lease_is_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, "0")
    with locks.device_lock(1) as gpu_lease:
        assert gpu_lease.contended is False  # alone at its start
        cpu_only(monkeypatch)  # another search's CPU trial starts, and ends, meanwhile
        cpu = Holder()
        assert cpu.entered.wait(5)
        assert cpu.lease is not None and cpu.lease.contended is True
        cpu.finish()
    assert gpu_lease.contended is True


def test_gpu_leases_on_two_devices_share_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, "0")
    with locks.device_lock(1) as first:
        gpus(monkeypatch, "1")
        second = Holder()
        assert second.entered.wait(5)  # not serialised: another device ...
        assert second.finish().contended is True  # ... but the same CPUs
    assert first.contended is True


def test_a_short_lease_inside_a_long_one_flags_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """The long trial is alone at its start and at its end; the short one ran in between."""
    cpu_only(monkeypatch)
    with locks.device_lock(1) as outer:
        inner = Holder()
        assert inner.entered.wait(5)
        assert inner.finish().contended is True
        assert outer.contended is False  # known at release
    assert outer.contended is True
    with locks.device_lock(1) as after:  # both gone: alone again
        pass
    assert after.contended is False


def test_a_short_lease_inside_a_long_one_across_processes(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    code = (
        "from autotune.trial.processes import locks\n"
        "locks._cuda_devices = lambda: ()\n"
        "with locks.device_lock(1) as lease:\n"
        "    pass\n"
        "print(lease.contended, flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "AUTOTUNE_LOCK_DIR": str(lock_dir)}
    with locks.device_lock(1) as outer:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True"]
    assert outer.contended is True


def test_sequential_leases_stay_uncontended_and_the_file_small(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    for _ in range(20):
        with locks.device_lock(1) as lease:
            pass
        assert lease.contended is False
    assert all(f.stat().st_size == 0 for f in cpu_lock_files(lock_dir))  # emptied by each last holder


def test_a_failing_trial_still_releases_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only(monkeypatch)
    with pytest.raises(RuntimeError):
        with locks.device_lock(1):
            raise RuntimeError("trial failed")
    with locks.device_lock(1) as lease:
        pass
    assert lease.contended is False
