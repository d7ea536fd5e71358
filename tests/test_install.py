"""A user installs the wheel into an environment that already has its torch: the package must not
demand a different torch, must carry its default search space, and must search from any folder."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.side_by_side

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installs_beside_the_users_torch_and_searches(tmp_path: Path) -> None:
    run = lambda *cmd, **kw: subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)  # noqa: E731
    # The wheel, built offline with the setuptools this environment has, from a copy of the sources
    # (an in-place build would leave build/ in the checkout).
    src = tmp_path / "src"
    shutil.copytree(ROOT / "autotune", src / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(tmp_path / "dist"),
        str(src),
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("autotune-*.whl"))
    # A fresh venv that sees this environment's packages (its torch, optuna, ...) but not this checkout.
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", str(venv)).returncode == 0
    py = venv / "bin" / "python"
    purelib = Path(run(str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    theirs = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "users-env.pth").write_text("\n".join(theirs) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    # No index and no deps: pip must accept the torch already there (metadata is a range, not a pin).
    installed = run(
        sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "--no-deps", str(wheel), env=env
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    check = run(str(py), "-m", "pip", "check", env=env) if (venv / "bin" / "pip").exists() else None
    assert check is None or "torch" not in check.stdout
    work = tmp_path / "work"
    work.mkdir()
    where = run(str(py), "-c", "import autotune; print(autotune.__file__)", cwd=work, env=env)
    assert str(purelib) in where.stdout, where.stdout + where.stderr  # the wheel, not the checkout
    autotune = venv / "bin" / "autotune"
    helped = run(str(autotune), "search", "--help", cwd=work, env=env)
    assert helped.returncode == 0 and "--budget" in helped.stdout
    shutil.copy(ROOT / "tests" / "external_pipeline" / "my_pipeline.py", work / "my_pipeline.py")
    searched = run(
        str(autotune),
        "search",
        "--budget",
        "3m",
        "--n-trials",
        "1",
        "--pipeline",
        "my_pipeline:make",
        "--trial-seconds",
        "1",
        "--warmup-steps",
        "1",
        "--cold-start",
        cwd=work,
        env={**env, "PYTHONPATH": str(work)},
    )
    assert searched.returncode == 0, searched.stdout[-2000:] + searched.stderr[-2000:]
    assert (work / "studies" / "autotune" / "best.yaml").is_file()
