"""search/loop/trial0.py: what trial 0 teaches the rest of a search; here, how long its windows must be."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.loop import trial0
from autotune.search.space.spec import DEFAULT_SPACE, SearchSpace
from autotune.search.space.reading import load_space
from autotune.search.store.records import TrialRecord

KEEPS_16 = Path(__file__).parents[2] / "trial" / "loop" / "script" / "scripts" / "keeps_16.py"
TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, seconds=15.0, window=3)


def settings(tmp_path: Path, base: TrialConfig = TINY) -> SearchSettings:
    return SearchSettings(storage=str(tmp_path / "studies.db"), studies_dir=str(tmp_path), base=base)


def test_windows_last_about_a_second_at_trial_0s_step_time(tmp_path: Path) -> None:
    """Seen on a public script with 1.7 ms steps: 3-step windows of 5 ms, and 71 of 76 trials pruned on
    them, most after "0 s". A window lasts at least about a second, and several steps."""
    said: list[str] = []
    space: SearchSpace = load_space(DEFAULT_SPACE)
    learned = trial0.lessons(
        settings(tmp_path), space, TrialRecord(role="baseline", metrics={"step_time_p50": 0.0017}), said.append
    )
    assert learned is not None and learned[0].base.window == 589 and learned[1] is space
    assert said == [
        "windows: 589 steps each from here (trial 0's steps take 1.7 ms; a window of 3 would last 5.1 ms, "
        "too short to measure or prune on)"
    ]
    # A step of 0.7 s (the Unet on a CPU): 3 steps already last 2 s, nothing changes.
    slow = TrialRecord(role="baseline", metrics={"step_time_p50": 0.7})
    assert trial0.lessons(settings(tmp_path), space, slow, said.append) is None and len(said) == 1
    # A trial of a fixed step count keeps a window it can fill.
    fixed = settings(tmp_path, TINY.replace(seconds=None, timed_steps=40))
    assert trial0.window(fixed, {"step_time_p50": 0.001}, said.append).base.window == 40


@pytest.mark.slow
@pytest.mark.side_by_side
def test_a_resumed_study_keeps_what_its_trial_0_taught(tmp_path: Path) -> None:
    """Seen on pytorch/examples' VAE: a study resumed (the same --study again) sampled checkpoint_segments on a
    model with no repeated blocks, trial after trial, each refused (exit 5): the space trial 0 had narrowed
    was the run's, not the study's. The resumed run learns from the stored trial 0 again."""
    from tests.pipelines.framework_helpers import autotune

    def search(n: int) -> str:
        run = autotune(
            "search", "--script", str(KEEPS_16), "--budget", "60s", "--n-trials", str(n), "--trial-seconds", "1",
            "--warmup-steps", "1", "--confirm-rounds", "0", "--parity-steps", "0", "--seed", "0", cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return run.stdout + run.stderr

    kept = "checkpoint_segments not searched from here: its model (Sequential) has no repeated blocks"
    assert kept in search(1)
    assert kept in search(3)  # resumed: trial 0 is not run again, its lesson is
