"""Shared fixtures: offline hub, one tiny synthetic dataset per session, a tiny TrialConfig,
torch global state restored after every test, helpers to find a trial's processes, a fake apex and a
warm server per module. The fakes themselves (NVML, apex, a free port, the fault config) are in fakes.py."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Callable, Iterator

# Before anything imports huggingface_hub (via smp): tests must never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
# The memory probe is one more process importing torch at every search start (seconds each): off,
# except in the tests of the memory estimate (tests/search/space/test_memory.py, tests/trial/probes/test_model_facts.py).
os.environ.setdefault("AUTOTUNE_MEMORY_PROBE", "0")
# So is the ceiling's measurement at every search's end (seconds each): off, except in tests/search/loop/test_export_ceiling.py.
os.environ.setdefault("AUTOTUNE_CEILING", "0")

import psutil  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from autotune.core.config import TrialConfig  # noqa: E402
from autotune.pipelines.unet.data import make_data  # noqa: E402
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer  # noqa: E402
from tests.fakes import APEX_MODULES, write_fake_apex  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 synthetic 160x120 photo/mask pairs, generated once for the whole session."""
    return make_data(tmp_path_factory.mktemp("tiny") / "data", n=24, size=(160, 120), seed=0)


@pytest.fixture
def tiny_config(tiny_data: Path) -> TrialConfig:
    """The Unet at 64 px, batch 2: one warm-up step, two timed steps, one step per window."""
    return TrialConfig(image_size=64, batch_size=2, warmup_steps=1, timed_steps=2, window=1, data_dir=str(tiny_data))


@pytest.fixture
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Trial subprocesses run with the test's cwd; they need the repo root to import tests.fault_pipelines."""
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT) + (os.pathsep + old if old else ""))
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # and in-process runs, whatever pytest's import mode
    return REPO_ROOT


@contextlib.contextmanager
def warm_server_on_repo(preload: tuple[str, ...]) -> Iterator[WarmServer]:
    """A warm server whose forked trials can import tests.* pipelines: the repo root on PYTHONPATH while
    it starts (a module-scoped fixture cannot use monkeypatch), restored after."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + old if old else "")
    try:
        with WarmServer.start(preload) as s:
            yield s
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(autouse=True)
def restore_torch_globals() -> Iterator[None]:
    """setup_process (and so trial.run) sets process-wide torch state; put it back after each test."""
    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


@pytest.fixture
def one_thread() -> None:
    """Unet compute on one intra-op thread: on a shared 2-core machine two threads that contend with
    other processes run a step 2-20x slower than one thread does. Restored by restore_torch_globals."""
    torch.set_num_threads(1)


def live_processes(marker: str) -> list[psutil.Process]:
    """Processes (not zombies, not this one) whose command line mentions `marker`.

    Forked loader workers keep their parent's command line, and torchrun ranks get the trial's
    --config path, so the trial directory names every process a trial starts.
    """
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in (p.info["cmdline"] or ())):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_until_gone(marker: str, timeout_s: float = 10.0) -> list[psutil.Process]:
    """Survivors after up to timeout_s (orphans are reaped by init, which takes a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = live_processes(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def all_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    """The pids still alive (not zombies) after up to timeout_s. A process killed a moment ago can read
    as running while the kernel tears it down (its command line is already empty), so poll, not look once."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Poll `cond` until it holds (True) or timeout_s passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# --- shared fixtures on the fakes in tests/fakes.py -------------------------------------------------


@contextlib.contextmanager
def _apex_on_path(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in APEX_MODULES:  # a real or earlier apex must not answer for the fake
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield root
    for name in APEX_MODULES:  # imported during the test: later tests must see apex absent again
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


@pytest.fixture
def fake_apex(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """apex with its compiled kernels on sys.path for this test: FusedAdam with apex's signatures."""
    with _apex_on_path(write_fake_apex(tmp_path / "site"), monkeypatch) as root:
        yield root


@pytest.fixture
def fake_apex_python_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """apex built without its CUDA extension: `apex.optimizers` imports, `amp_C` is absent (a test may
    write <root>/amp_C.py to add it)."""
    with _apex_on_path(write_fake_apex(tmp_path / "site", with_kernels=False), monkeypatch) as root:
        yield root


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[WarmServer]:
    """One warm server for a test module's trials (a fork each instead of seconds of imports). The
    module names its preload in WARM_PRELOAD (default: a search's own); its forked trials can import
    tests.* pipelines."""
    with warm_server_on_repo(tuple(getattr(request.module, "WARM_PRELOAD", DEFAULT_PRELOAD))) as s:
        yield s


@pytest.fixture
def classifier(tmp_path: Path) -> Iterator[Path]:
    """tests/apply/export/scripts' classifier.py and tinymodel.py (where it builds its AdamW), copied; the
    module imported afresh (a trial running in this process may have cached another test's copy)."""
    for name in ("classifier.py", "tinymodel.py"):
        shutil.copy(REPO_ROOT / "tests" / "apply" / "export" / "scripts" / name, tmp_path / name)
    sys.modules.pop("tinymodel", None)
    yield tmp_path / "classifier.py"
    sys.modules.pop("tinymodel", None)
