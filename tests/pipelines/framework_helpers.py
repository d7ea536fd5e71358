"""What the Lightning and transformers tests share: the docs' examples as written (docs/own-model.md),
the CLI in a subprocess, and a check that a framework search exported something that round-trips
through `trial`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from autotune.core.config import KNOBS
from tests.conftest import REPO_ROOT
from tests.docs_pages import DOCS, autotune_commands, python_block

# The page of the framework jobs' examples: "Your Lightning module or HF Trainer job".
EXAMPLES_PAGE = DOCS / "own-model.md"

# A search long enough for the baseline, the warm start and a few more, short enough for the suite.
SHORT_SEARCH = (
    "--budget",
    "30s",
    "--trial-seconds",
    "1",
    "--warmup-steps",
    "1",
    "--confirm-rounds",
    "0",
    "--parity-steps",
    "0",
    "--seed",
    "0",
)


def doc_example(name: str) -> str:
    """The page's Python block that opens with `# <name>`: the example exactly as a reader copies it."""
    block = python_block(EXAMPLES_PAGE, f"# {name}")
    assert block.startswith(f"# {name}"), block[:80]
    return block


def doc_commands(name: str) -> list[list[str]]:
    """The page's `autotune ...` lines of the bash block that uses `name`, as argument lists."""
    return autotune_commands(EXAMPLES_PAGE, f":{name}:make")


def autotune(
    *args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    paths = [str(pythonpath)] if pythonpath else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def ok(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"


def with_short_budget(command: list[str]) -> list[str]:
    """The page's search command, its 10-minute budget replaced by the suite's short search: the baseline,
    the warm start and one search trial (every kind of trial), or 30 s, whichever ends first."""
    i = command.index("--budget")
    return [*command[:i], *command[i + 2 :], *SHORT_SEARCH, "--n-trials", "3"]


def trials(storage: Path, study: str) -> list[Any]:
    import optuna

    from autotune.search.store.storage import open_storage

    return optuna.load_study(study_name=study, storage=open_storage(str(storage))).get_trials(deepcopy=False)


def no_trial_broke(storage: Path, study: str) -> list[Any]:
    """The finished trials; none crashed, was refused or went non-finite, and at least two completed."""
    import optuna

    done = trials(storage, study)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in done) >= 2, "not even the baseline and one more"
    bad = [
        (t.number, t.user_attrs.get("reason"), t.user_attrs.get("message"), t.user_attrs.get("log_tail", "")[-1500:])
        for t in done
        if t.user_attrs.get("reason") in ("crash", "bad_config", "unsupported", "numerics")
    ]
    assert not bad, bad
    return done


def round_trips(best: Path, result: Path) -> dict[str, Any]:
    """The page's `autotune trial --config best.yaml` re-measured exactly the exported knobs, under the
    same framework arguments; returns its result."""
    exported = yaml.safe_load(best.read_text())
    measured = json.loads(result.read_text())
    assert measured["status"] == "ok" and measured["loss_finite"] and measured["timed_steps"] >= 1, measured
    assert {k: measured["applied"][k]["requested"] for k in KNOBS} == exported["config"]
    assert measured["applied"]["framework"] == exported["framework"]
    return measured
