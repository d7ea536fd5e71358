"""launch.sh installs what each command needs: the runtime for a user's commands, the test tools only
for `test` and `lint`. pip is stood in for by a script that records its arguments (the real install is
what CI's own first `./launch.sh` does); everything else about launch.sh runs as written."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = ("pytest", "ruff", "mypy", "import-linter", "lightning", "transformers", "accelerate", "torchx")


def _fake_venv(venv: Path) -> Path:
    """A venv whose pip logs each call and whose python/autotune just say who they are."""
    bin_ = venv / "bin"
    bin_.mkdir(parents=True)
    log = venv / "pip.log"
    scripts = {
        "pip": f'#!/bin/sh\necho "$*" >> {log}\n',
        "python": '#!/bin/sh\necho "python $*"\n',
        "autotune": '#!/bin/sh\necho "autotune $*"\n',
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    return log


def _launch(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AUTOTUNE_VENV": str(venv)}
    return subprocess.run([str(ROOT / "launch.sh"), *args], capture_output=True, text=True, env=env, timeout=60)


def test_user_commands_install_the_runtime_and_test_adds_the_tools(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    log = _fake_venv(venv)
    searched = _launch(venv, "search", "--help")
    assert searched.returncode == 0 and "autotune search --help" in searched.stdout, searched.stderr
    installs = [line for line in log.read_text().splitlines() if line.startswith("install -e")]
    assert installs == [f"install -e {ROOT}"], installs  # the runtime: no [test] extra

    again = _launch(venv, "show", "--help")  # installed once: a second user command installs nothing
    assert again.returncode == 0 and log.read_text().count("install -e") == 1

    tested = _launch(venv, "test", "--version")
    assert tested.returncode == 0 and "python -m pytest --version" in tested.stdout, tested.stderr
    installs = [line for line in log.read_text().splitlines() if line.startswith("install -e")]
    assert installs[-1] == f"install -e {ROOT}[test]", installs

    after = _launch(venv, "search", "--help")  # the test install holds the runtime: nothing more to install
    assert after.returncode == 0 and log.read_text().count("install -e") == 2


def test_the_runtime_dependencies_hold_no_test_tool() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(meta["dependencies"]).lower()
    assert not [t for t in TEST_TOOLS if t in runtime], runtime
    extras = meta["optional-dependencies"]
    assert {"postgres", "frameworks", "multinode", "test"} <= set(extras)
    test_extra = " ".join(extras["test"])
    assert "autotune[postgres,frameworks,multinode]" in test_extra  # the suite exercises every extra


def test_the_whole_suite_runs_what_times_nothing_side_by_side_and_the_timed_tests_alone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _fake_venv(venv)
    whole = _launch(venv, "test")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.splitlines() == [
        "python -m pytest -m not slow and not alone -n auto",
        "python -m pytest -m slow and side_by_side and not alone -n auto --durations=10",
        "python -m pytest -m alone or (slow and not side_by_side) --durations=15",
    ], whole.stdout
    # A failure in the quick pass still lets the others run, and fails the suite.
    (venv / "bin" / "python").write_text('#!/bin/sh\necho "python $*"\ncase "$*" in *"not slow"*) exit 1;; esac\n')
    failed = _launch(venv, "test")
    assert failed.returncode == 1 and len(failed.stdout.splitlines()) == 3, failed.stdout
    # Arguments name what to run: one pass, as given.
    assert _launch(venv, "test", "tests/core").stdout.splitlines() == ["python -m pytest tests/core"]
