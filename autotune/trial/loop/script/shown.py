"""What a script trial's run showed (Shown): the one narrow record the seams fill as the script runs and
hand over when it stops. records.py turns it into each knob's record; nothing there reads the seams
themselves.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shown:
    """loaders: each DataLoader the script built (its batch size, its loader knobs, its sampler, and `kept`:
    why it kept its own). built: each optimizer it built (type, the lr it gave and the one set, the factor,
    `own_schedule`, `planned_for`). stepped: each that stepped (type, fusion). zero_grads: set_to_none as
    each call ran it. step_samples, step_batches, step_backwards: per optimizer step, a rank's loaders'
    samples and batches, and its backward passes of a scalar loss. fed: the batch its model was fed, where
    it was found. final: what the run showed when the trial stopped it (device, ranks, global batch, the
    model's observations). sites: what the diff edits (the model's among them). model: the model's facts, and
    `model_seen`: each routed model knob as it ran, and why (trial/loop/script/model.py)."""

    loaders: tuple[dict[str, Any], ...] = ()
    built: tuple[dict[str, Any], ...] = ()
    stepped: tuple[dict[str, Any], ...] = ()
    zero_grads: tuple[bool, ...] = ()
    step_samples: tuple[int, ...] = ()
    step_batches: tuple[int, ...] = ()
    step_backwards: tuple[int, ...] = ()
    fed: int | None = None
    steps: int = 0
    samples_per_step: float | None = None
    lr_last_step: tuple[Any, ...] = ()
    seeds: tuple[Any, ...] = ()
    shuffled: bool = False
    process_group: str | None = None
    final: dict[str, Any] = field(default_factory=dict)
    sites: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    model_seen: dict[str, tuple[Any, str]] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        """A rank's loaders' samples per optimizer step (the most common count); 0: no loader counted any."""
        return per_step(self.step_samples)

    @property
    def batches(self) -> int:
        return per_step(self.step_batches)

    @property
    def backwards(self) -> int:
        return per_step(self.step_backwards)


def per_step(counts: list[int] | tuple[int, ...]) -> int:
    """The samples (or batches) a rank's loaders delivered per optimizer step: the most common count (an
    epoch's last, smaller batch aside); 0 when no loader delivered any."""
    counted = collections.Counter(n for n in counts if n)
    return counted.most_common(1)[0][0] if counted else 0
