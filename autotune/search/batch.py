"""A study's global batch: which micro-batch x GPU-count combinations compute exactly that optimizer step.

With `--global-batch N` every trial trains with N samples per optimizer step: batch_size is the
micro-batch per process and grad_accum = N / (batch_size x gpus) is derived. Optuna samples knobs
one at a time, so instead of letting a combination that does not divide N fail as a trial, the space
is narrowed before the study starts to values that divide N with every GPU count it keeps.
"""
from __future__ import annotations

from typing import Any

from autotune.core.errors import SearchSpaceError
from autotune.search.space import Choices, Fixed, IntRange, SearchSpace, Spec


def _values(spec: Spec | None, default: int) -> list[int]:
    if spec is None:
        return [default]
    if isinstance(spec, Fixed):
        return [spec.value]
    return list(spec.values()) if isinstance(spec, IntRange) else list(spec.values)


def _as_spec(values: list[int]) -> Spec:
    return Fixed(values[0]) if len(values) == 1 else Choices(tuple(values))


def narrow(space: SearchSpace, global_batch: int | None, base: Any) -> tuple[SearchSpace, list[str]]:
    """`space` with batch_size and gpus kept to divisors of `global_batch`, and one note per drop.
    A global batch nothing in the space divides is bad input (SearchSpaceError, exit 2)."""
    if global_batch is None:
        return space, []
    knobs = dict(space.knobs)
    batches = _values(knobs.get("batch_size"), base.batch_size)
    gpus_all = _values(knobs.get("gpus"), base.gpus)
    gpus = [g for g in gpus_all if any(global_batch % (b * g) == 0 for b in batches)]
    kept = [b for b in batches if gpus and all(global_batch % (b * g) == 0 for g in gpus)]
    if not kept:
        raise SearchSpaceError(f"--global-batch {global_batch}: no micro-batch x GPU count in the space divides it "
                               f"(batch_size {batches}, gpus {gpus_all})")
    notes = []
    for knob, before, after in (("gpus", gpus_all, gpus), ("batch_size", batches, kept)):
        if after != before and knob in knobs:
            dropped = [v for v in before if v not in after]
            notes.append(f"{knob}: dropped {', '.join(map(str, dropped))} (global batch {global_batch} must be "
                         "batch_size x gpus x a whole number of accumulation steps)")
            knobs[knob] = _as_spec(after)
    return SearchSpace(knobs=knobs, source=space.source), notes
