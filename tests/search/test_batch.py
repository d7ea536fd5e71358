"""search/batch.py: a study's global batch narrows the space to combinations that divide it."""
from __future__ import annotations

import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import SearchSpaceError
from autotune.search.batch import narrow
from autotune.search.space import Choices, Fixed, IntRange, SearchSpace

BASE = TrialConfig(batch_size=16, global_batch=16)


def space(**knobs: object) -> SearchSpace:
    return SearchSpace(knobs=dict(knobs), source="test.yaml")  # type: ignore[arg-type]


def test_free_batch_leaves_the_space_alone() -> None:
    s = space(batch_size=Choices((3, 5)))
    assert narrow(s, None, TrialConfig()) == (s, [])


def test_micro_batches_that_do_not_divide_are_dropped_and_said() -> None:
    s, notes = narrow(space(batch_size=Choices((2, 4, 8, 16, 32, 6)), gpus=Fixed(1)), 16, BASE)
    assert s["batch_size"] == Choices((2, 4, 8, 16))
    assert notes == ["batch_size: dropped 32, 6 (global batch 16 must be batch_size x gpus x a whole number of "
                     "accumulation steps)"]


def test_every_kept_pair_divides_with_every_kept_gpu_count() -> None:
    s, notes = narrow(space(batch_size=IntRange(1, 16), gpus=IntRange(1, 3)), 16, BASE)
    assert s["gpus"] == Choices((1, 2)) and s["batch_size"] == Choices((1, 2, 4, 8))
    for b in s["batch_size"].values:
        for g in s["gpus"].values:
            assert TrialConfig(batch_size=b, gpus=g, global_batch=16).grad_accum * b * g == 16
    assert any(n.startswith("gpus: dropped 3") for n in notes)


def test_a_global_batch_nothing_divides_is_bad_input() -> None:
    with pytest.raises(SearchSpaceError, match="--global-batch 7: no micro-batch x GPU count in the space divides it"):
        narrow(space(batch_size=Choices((2, 4, 8))), 7, TrialConfig(batch_size=7, global_batch=7))
