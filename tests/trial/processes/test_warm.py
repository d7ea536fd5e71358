"""autotune/warm.py: a trial forked by the warm server is, to the launcher, a cold trial process that
started faster: same result, same exit codes, killable by process group (loader workers included),
fresh RNG state, and nothing left running when the trial, the server or the controller goes away."""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.core import errors

from autotune.trial.processes import launcher
from autotune.core.config import TrialConfig
from autotune.core.files import write_json_atomic
from autotune.trial.loop.worker import LAUNCH_TIME_ENV
from autotune.trial.processes.warm_client import WarmProcess, WarmServer, WarmServerError
from tests.conftest import REPO_ROOT, all_gone
from tests.fakes import LIGHT_PRELOAD, fault_cfg
from tests.fault_pipelines import TinyPipeline

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("repo_on_path"), pytest.mark.side_by_side]

# The `server` fixture (conftest) has the default preload here, WARM_PRELOAD being unset: a search's.


def trial_env(**extra: str) -> dict[str, str]:
    """What the launcher gives a trial: its own env, the launch time, unbuffered output."""
    return {**os.environ, LAUNCH_TIME_ENV: repr(time.time()), "PYTHONUNBUFFERED": "1", **extra}


def spawn(server: WarmServer, cfg: TrialConfig, trial_dir: Path, **env: str) -> WarmProcess:
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(trial_dir / "config.json", cfg.to_dict())
    argv = launcher.command(cfg, trial_dir)[3:]  # what follows `python -m autotune.trial`
    return server.spawn(argv, trial_env(**env), os.getcwd(), trial_dir / "trial.log")


def log(trial_dir: Path) -> str:
    return (trial_dir / "trial.log").read_text(errors="replace")


def reported_pids(prefix: Path, timeout_s: float = 90.0) -> dict[str, Any]:
    """The hang pipeline's own pid and its loader workers', once it has written them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(prefix.parent.glob(f"{prefix.name}.*[0-9]"))
        if found:
            data: dict[str, Any] = json.loads(found[0].read_text())
            return data
        time.sleep(0.1)
    raise AssertionError(f"the trial never reported its pids ({prefix})")


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One cold trial through today's launcher, to compare the warm ones with."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + old if old else "")
    try:
        trial_dir = tmp_path_factory.mktemp("cold")
        launcher.run_trial(fault_cfg(), trial_dir, timeout_s=180)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    result: dict[str, Any] = json.loads((trial_dir / "result.json").read_text())
    return result


# --- a healthy trial ------------------------------------------------------------------------------


@pytest.mark.alone  # compares a warm trial's figures with a cold one's: a neighbour would move them
def test_warm_result_has_the_cold_shape(server: WarmServer, cold: dict[str, Any], tmp_path: Path) -> None:
    p = spawn(server, fault_cfg(), tmp_path)
    assert os.getpgid(p.pid) == p.pid  # its own group, from the moment its pid is known
    assert p.wait(timeout=120) == 0, log(tmp_path)
    assert p.poll() == 0 and p.returncode == 0
    warm = json.loads((tmp_path / "result.json").read_text())
    assert warm["status"] == cold["status"] == "ok"
    assert {k: type(v) for k, v in warm.items()} == {k: type(v) for k, v in cold.items()}
    assert warm["applied"] == cold["applied"]  # every knob took the same effect (thread count included)
    assert warm["timed_steps"] == cold["timed_steps"] == 4
    assert "samples/s" in log(tmp_path)  # the trial's stdout reached its own log
    assert launcher._classify(0, tmp_path, tmp_path / "trial.log", []).status == "ok"


def test_warm_startup_is_much_shorter_than_cold(server: WarmServer, cold: dict[str, Any], tmp_path: Path) -> None:
    p = spawn(server, fault_cfg(), tmp_path)
    assert p.wait(timeout=120) == 0, log(tmp_path)
    warm_s = json.loads((tmp_path / "result.json").read_text())["startup_s"]
    print(f"startup_s: warm {warm_s:.3f} s, cold {cold['startup_s']:.3f} s")
    assert 0 < warm_s < cold["startup_s"] / 2


# --- failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "factory, code, exc",
    [
        ("oom", 3, errors.TrialOOM),
        ("nan", 4, errors.TrialNumerics),
        ("broken", 1, errors.TrialCrashed),
    ],
)
def test_exit_codes_pass_through(
    server: WarmServer, tmp_path: Path, factory: str, code: int, exc: type[Exception]
) -> None:
    p = spawn(server, fault_cfg(factory), tmp_path)
    assert p.wait(timeout=120) == code, log(tmp_path)
    with pytest.raises(exc):
        launcher._classify(code, tmp_path, tmp_path / "trial.log", [])


def test_killpg_kills_the_trial_and_its_loader_workers(server: WarmServer, tmp_path: Path) -> None:
    report = tmp_path / "pids"
    p = spawn(server, fault_cfg("hang_loss_reporting", num_workers=2), tmp_path / "t", AUTOTUNE_TEST_PIDS=str(report))
    pids = reported_pids(report)
    assert pids["pid"] == p.pid and len(pids["children"]) >= 2, pids  # the two loader workers
    assert {os.getpgid(c) for c in pids["children"]} == {p.pid}
    assert p.poll() is None
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert p.poll() == -9
    assert not all_gone([p.pid, *pids["children"]])
    with pytest.raises(errors.TrialCrashed, match="SIGKILL"):
        launcher._classify(-9, tmp_path / "t", tmp_path / "t" / "trial.log", [])


def test_wait_times_out_like_popen(server: WarmServer, tmp_path: Path) -> None:
    p = spawn(server, fault_cfg("hang_dataset"), tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.3)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -9


def test_closing_the_server_kills_its_running_trials(tmp_path: Path) -> None:
    report = tmp_path / "pids"
    server = WarmServer.start(LIGHT_PRELOAD)
    try:
        p = spawn(
            server, fault_cfg("hang_loss_reporting", num_workers=2), tmp_path / "t", AUTOTUNE_TEST_PIDS=str(report)
        )
        pids = reported_pids(report)
    finally:
        server.close()
    assert p.wait(timeout=10) == -9 and not p.server_lost  # reported by the server on its way out
    assert not all_gone([server.pid, p.pid, *pids["children"]])
    assert not server.socket_path.parent.exists()


CONTROLLER = """
import json, sys, time
from autotune.trial.processes.warm_client import WarmServer
argv, env, cwd, log = json.loads(sys.argv[1])
server = WarmServer.start({light!r})
p = server.spawn(argv, env, cwd, log)
print(server.pid, p.pid, server.socket_path.parent, flush=True)
time.sleep(600)
"""


def test_a_killed_controller_leaves_no_server_and_no_trial(tmp_path: Path) -> None:
    trial_dir, report = tmp_path / "t", tmp_path / "pids"
    trial_dir.mkdir()
    cfg = fault_cfg("hang_loss_reporting", num_workers=2)
    write_json_atomic(trial_dir / "config.json", cfg.to_dict())
    request = [
        launcher.command(cfg, trial_dir)[3:],
        trial_env(AUTOTUNE_TEST_PIDS=str(report)),
        os.getcwd(),
        str(trial_dir / "trial.log"),
    ]
    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER.format(light=LIGHT_PRELOAD), json.dumps(request)],
        stdout=subprocess.PIPE,
        env=os.environ.copy(),
    )
    try:
        assert controller.stdout is not None
        ready, _, _ = select.select([controller.stdout], [], [], 90)
        assert ready, "the controller never started its server"
        server_pid, child_pid, folder = controller.stdout.readline().decode().split()
        pids = reported_pids(report)
        assert pids["pid"] == int(child_pid)
    finally:
        controller.kill()  # SIGKILL: no finally, no close(); only PR_SET_PDEATHSIG cleans up
        controller.wait()
    # Loader workers notice their parent's death by polling (torch checks every 5 s).
    assert not all_gone([int(server_pid), int(child_pid), *pids["children"]], timeout_s=20)
    shutil.rmtree(folder)  # the one thing a SIGKILLed controller leaves: its server's empty temp folder


# --- isolation ------------------------------------------------------------------------------------


class SeedReporter(TinyPipeline):
    """Writes the RNG draws it sees when the trial builds it, before anything reseeds them."""

    def __init__(self, cfg: Any) -> None:
        import numpy as np

        super().__init__(cfg)
        draws = {
            "random": random.random(),
            "numpy": float(np.random.random_sample()),
            "cwd": os.getcwd(),
            "argv0": sys.argv[0],
            "marker": os.environ.get("AUTOTUNE_TEST_MARKER"),
            "fds": {fd: _readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")},
        }
        Path(os.environ["AUTOTUNE_TEST_SEEDS"]).write_text(json.dumps(draws))


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # the fd listdir itself used, closed by now
        return ""


def seed_reporter(cfg: Any) -> SeedReporter:
    return SeedReporter(cfg)


def test_children_get_fresh_rng_state_env_and_cwd(
    server: WarmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws = []
    for i in range(2):
        here = tmp_path / f"cwd{i}"
        here.mkdir()
        monkeypatch.chdir(here)
        p = spawn(
            server,
            fault_cfg().replace(pipeline="tests.trial.processes.test_warm:seed_reporter"),
            tmp_path / f"t{i}",
            AUTOTUNE_TEST_SEEDS=str(tmp_path / f"seeds{i}"),
            AUTOTUNE_TEST_MARKER=str(i),
        )
        assert p.wait(timeout=120) == 0, log(tmp_path / f"t{i}")
        draws.append(json.loads((tmp_path / f"seeds{i}").read_text()))
        assert draws[i]["cwd"] == str(here) and draws[i]["marker"] == str(i)
        assert draws[i]["argv0"].endswith("autotune/trial/loop/worker.py")
        # Nothing of the server's (its socket, its other connections, its wake-up pipe) leaks in.
        assert not [t for t in draws[i]["fds"].values() if t.startswith(("socket:", "pipe:", "anon_inode:"))], draws[i]
        assert draws[i]["fds"]["1"] == draws[i]["fds"]["2"] == str(tmp_path / f"t{i}" / "trial.log")
    assert draws[0]["random"] != draws[1]["random"]
    assert draws[0]["numpy"] != draws[1]["numpy"]


# --- refusing, so the launcher can start the trial cold -------------------------------------------


def test_bad_argv_exits_2_like_argparse(tmp_path: Path) -> None:
    with WarmServer.start(preload=()) as server:
        p = server.spawn(["--no-such-flag"], trial_env(), os.getcwd(), tmp_path / "trial.log")
        assert p.wait(timeout=60) == 2
    assert "usage: python -m autotune.trial" in (tmp_path / "trial.log").read_text()


def test_an_import_time_variable_that_differs_is_refused(tmp_path: Path) -> None:
    with WarmServer.start(preload=()) as server:
        env = trial_env(OMP_NUM_THREADS="7" if os.environ.get("OMP_NUM_THREADS") != "7" else "3")
        with pytest.raises(WarmServerError, match="OMP_NUM_THREADS"):
            server.spawn(["--help"], env, os.getcwd(), tmp_path / "trial.log")
        assert server.alive()  # a refusal is not a failure of the server


def test_a_malformed_request_is_refused_and_the_server_lives_on(tmp_path: Path) -> None:
    import socket

    with WarmServer.start(preload=()) as server:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(server.socket_path))
            s.sendall(b"not json\n")
            assert b"malformed request" in s.recv(4096)
        p = server.spawn(["--no-such-flag"], trial_env(), os.getcwd(), tmp_path / "trial.log")
        assert p.wait(timeout=60) == 2


def test_spawn_on_a_dead_server_raises_a_clear_error(tmp_path: Path) -> None:
    server = WarmServer.start(preload=())
    try:
        os.kill(server.pid, signal.SIGKILL)
        while server.alive():
            time.sleep(0.02)
        with pytest.raises(WarmServerError, match="not running.*-9"):
            server.spawn(["--help"], trial_env(), os.getcwd(), tmp_path / "trial.log")
    finally:
        server.close()


def test_a_trial_whose_server_dies_reads_as_sigkilled(tmp_path: Path) -> None:
    server = WarmServer.start(preload=())
    try:
        p = spawn(server, fault_cfg("hang_dataset"), tmp_path)
        os.kill(server.pid, signal.SIGKILL)
        assert p.wait(timeout=10) == -9 and p.server_lost
        assert not all_gone([p.pid])  # PR_SET_PDEATHSIG
    finally:
        server.close()


def test_a_server_that_cannot_start_says_why() -> None:
    with pytest.raises(WarmServerError, match="no_such_module"):
        WarmServer.start(preload=("no_such_module",))
