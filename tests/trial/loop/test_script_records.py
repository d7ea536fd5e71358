"""What a script trial records is what ran: the batch a script keeps (its DataLoader's), read from its
source and checked against what its loaders delivered at run time, the unit its throughput is counted in,
and whether the run seeded torch and followed the data seed (what parity can compare)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.core.config import TrialConfig, baseline_of
from autotune.pipelines import base_config, load_pipeline, own_baseline, script
from autotune.search.checks import parity
from autotune.trial.loop import worker

SCRIPTS = Path(__file__).parent / "scripts"
KEEPS_16 = SCRIPTS / "keeps_16.py"


def study_base(path: Path, args: list[str], **extra: Any) -> TrialConfig:
    """The study's workload as `autotune search --script` makes it (the session's own_baseline)."""
    base = base_config(script.spec_of(str(path), args), None, None, "studies", **extra)
    own = own_baseline(load_pipeline(base), base.global_batch)
    base = base.replace(num_threads=1, warmup_steps=1, timed_steps=3, window=1)
    return base.replace(baseline=tuple(own.items())) if own else base


def test_a_script_that_keeps_batch_16_records_16(tmp_path: Path, server: Any) -> None:
    base = study_base(KEEPS_16, [])
    baseline = baseline_of(base)
    assert baseline.batch_size == 16 and baseline.global_batch_size == 16
    a = worker.run(baseline).applied
    assert a["batch_size"]["requested"] == 16 and a["batch_size"]["in_effect"] == 16
    assert a["global_batch"]["in_effect"] == 16 and a["script"]["samples_per_step"] == 16
    ref = parity.noise_reference(baseline, 4, tmp_path / "reference", 120, server)
    assert ref.samples == 4 * 16
