"""A framework pipeline's trial: the framework's own loop (Lightning's Trainer.fit, transformers'
Trainer.train), whose callback drives the trial's one Clock (trial.measurement.clock) as autotune's own
loop does: told the Trainer's train loader, so the batches its workers made ahead are drained before the
timed window, and each step's fetch, end and loss. The result is the worker's TrialResult, so the search,
parity and time to target read it unchanged.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial; the frameworks lazily.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.effects import knob_effect, refuse_unsupported
from autotune.pipelines import load_pipeline
from autotune.pipelines.frameworks import FrameworkJob
from autotune.trial.loop import knobs
from autotune.trial.measurement import measure
from autotune.trial.measurement.clock import Clock

# max_steps for a time-boxed trial: the callback stops it; a framework needs some number.
FOREVER = 10**9


def run(cfg: TrialConfig, progress: Path | None, launched: float) -> TrialResult:
    """One trial of a framework pipeline, in this process (one rank of torchrun when gpus > 1)."""
    rank, world, local_rank = knobs.dist_env()
    device = knobs.pick_device(local_rank)
    applied: dict[str, Any] = knobs.setup_process(cfg, device)
    seed_all(cfg.seed + rank)  # the factory builds the model: its initial weights follow the seed
    job = load_pipeline(cfg)
    assert isinstance(job, FrameworkJob)
    refuse_unsupported(cfg, job.unsupported)
    knobs.refuse_past_stages(cfg, tuple(job.stages or ()))
    memory_total = measure.memory_total_bytes(device)
    clock = Clock(cfg, device, rank, world, progress, launched)
    if job.library == "lightning":
        from autotune.trial.loop.frameworks.lightning import train
    else:
        from autotune.trial.loop.frameworks.hf import train  # type: ignore[assignment]
    with contextlib.ExitStack() as stack:
        # The framework's own files (HF's output_dir, Lightning's root dir): beside the progress file, or,
        # for a trial run in-process without one, in a folder removed afterwards.
        workdir = progress.parent if progress is not None else Path(stack.enter_context(_scratch()))
        applied |= train(cfg, job, clock, device, workdir)  # type: ignore[arg-type]  # the job matches the library just chosen
    if cfg.profile:
        applied["profile"] = knob_effect(True, False, "the framework owns the loop: profile it with its own profiler")
    return clock.result(applied, memory_total)


def _scratch() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="autotune-trial-", ignore_cleanup_errors=True)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
