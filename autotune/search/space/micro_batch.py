"""A study's global batch: which micro-batch x GPU-count combinations compute exactly that optimizer step.

With `--global-batch N` every trial trains with N samples per optimizer step: batch_size is the
micro-batch per process and grad_accum = N / (batch_size x gpus) is derived. Before the study starts,
the space is narrowed to GPU counts that some micro-batch fits and to micro-batches that fit some GPU
count. A pair must divide N, so when the GPU count is searched, suggest.suggest samples it first and then
the micro-batch among that count's divisors (one parameter per count, `suggest.micro_batch_param`): each
parameter keeps one distribution, so the sampler's statistics stay sound, and no micro-batch is dropped
for every GPU count because one count cannot use it.
"""

from __future__ import annotations

from typing import Any

from autotune.core.errors import SearchSpaceError
from autotune.search.space.spec import Choices, Fixed, SearchSpace, Spec, spec_values


def _values(spec: Spec | None, default: int) -> list[int]:
    return [default] if spec is None else spec_values(spec)


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
    kept = [b for b in batches if any(global_batch % (b * g) == 0 for g in gpus)]
    if not kept:
        raise SearchSpaceError(
            f"--global-batch {global_batch}: no micro-batch x GPU count in the space divides it "
            f"(batch_size {batches}, gpus {gpus_all})"
        )
    notes = []
    for knob, before, after in (("gpus", gpus_all, gpus), ("batch_size", batches, kept)):
        if after != before and knob in knobs:
            dropped = [v for v in before if v not in after]
            notes.append(
                f"{knob}: dropped {', '.join(map(str, dropped))} (global batch {global_batch} must be "
                "batch_size x gpus x a whole number of accumulation steps, for some "
                f"{'batch_size' if knob == 'gpus' else 'GPU count'} in the space)"
            )
            knobs[knob] = _as_spec(after)
    return SearchSpace(knobs=knobs, source=space.source), notes
