"""search/space/resolve.py: a study's global batch narrows the space to combinations that divide it."""

from __future__ import annotations

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.core.errors import SearchSpaceError
from autotune.search.space.resolve import by_global_batch as narrow
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace
from autotune.search.space.suggest import config_params, micro_batch_param, suggest

BASE = TrialConfig(batch_size=16, global_batch=16)


def space(**knobs: object) -> SearchSpace:
    return SearchSpace(knobs=dict(knobs), source="test.yaml")  # type: ignore[arg-type]


def test_free_batch_leaves_the_space_alone() -> None:
    s = space(batch_size=Choices((3, 5)))
    assert narrow(s, TrialConfig()) == (s, [])


def test_micro_batches_that_do_not_divide_are_dropped_and_said() -> None:
    s, notes = narrow(space(batch_size=Choices((2, 4, 8, 16, 32, 6)), gpus=Fixed(1)), BASE)
    assert s["batch_size"] == Choices((2, 4, 8, 16))
    assert notes == [
        "batch_size: dropped 32, 6 (global batch 16 must be batch_size x gpus x a whole number of "
        "accumulation steps, for some GPU count in the space)"
    ]


def test_a_micro_batch_is_kept_when_some_gpu_count_can_use_it() -> None:
    """N = 64 on 8 GPUs: micro-batches 16-64 don't fit 8 processes, but they do fit 1 (issue: they were
    dropped for every count)."""
    s, notes = narrow(space(batch_size=Choices((8, 16, 32, 64)), gpus=IntRange(1, 8)), BASE.replace(global_batch=64))
    assert s["batch_size"] == Choices((8, 16, 32, 64))
    assert s["gpus"] == Choices((1, 2, 4, 8))
    assert notes == [
        "gpus: dropped 3, 5, 6, 7 (global batch 64 must be batch_size x gpus x a whole number of "
        "accumulation steps, for some batch_size in the space)"
    ]


def test_each_gpu_count_samples_its_own_divisors() -> None:
    """gpus first, then the micro-batch among that count's divisors: every trial divides N, each count's
    parameter keeps one distribution (Optuna refuses a parameter whose choices change), and an enqueued
    config lands on its count's parameter."""
    base = TrialConfig(batch_size=8, global_batch=64)
    s, _ = narrow(space(batch_size=Choices((8, 16, 32, 64)), gpus=IntRange(1, 8)), base)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        cfg = suggest(trial, s, base)
        assert cfg.global_batch_size == 64 and cfg.batch_size * cfg.gpus <= 64
        seen.add((cfg.gpus, cfg.batch_size))
        study.tell(trial, 1.0)
    assert (1, 64) in seen and (8, 8) in seen and (2, 32) in seen
    assert set(study.trials[0].params) <= {"gpus", micro_batch_param(study.trials[0].params["gpus"])}
    cfg = base.replace(gpus=2, batch_size=16)
    assert config_params(cfg, s) == {"gpus": 2, micro_batch_param(2): 16}
    study.enqueue_trial(config_params(cfg, s))
    assert suggest(study.ask(), s, base) == cfg


def test_a_global_batch_nothing_divides_is_bad_input() -> None:
    with pytest.raises(SearchSpaceError, match="--global-batch 7: no micro-batch x GPU count in the space divides it"):
        narrow(space(batch_size=Choices((2, 4, 8))), TrialConfig(batch_size=7, global_batch=7))


def test_a_job_that_keeps_its_accumulation_runs_the_global_batch_divided_over_its_ranks() -> None:
    """A script that accumulates 2 micro-batches on its own (no at.accumulation()) at N = 64: each GPU count
    runs 64 / (gpus x 2), whatever micro-batches the space lists, and no trial needs another accumulation."""
    base = TrialConfig(batch_size=32, global_batch=64, own_accumulation=2, keeps_accumulation=True)
    s, notes = narrow(space(batch_size=Choices((8, 16)), gpus=IntRange(1, 8)), base)
    assert s["batch_size"] == Choices((4, 8, 16, 32)) and s["gpus"] == Choices((1, 2, 4, 8))
    assert notes[0].startswith("batch_size: 4, 8, 16, 32, the global batch 64 divided over each GPU count's ranks")
    assert "x its own 2 accumulation steps" in notes[1], notes
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        cfg = suggest(trial, s, base)
        assert cfg.grad_accum == 2 and cfg.global_batch_size == 64
        assert set(trial.params) == {"gpus"}  # the micro-batch follows from the count: not sampled
        seen.add((cfg.gpus, cfg.batch_size))
        study.tell(trial, 1.0)
    assert seen == {(1, 32), (2, 16), (4, 8), (8, 4)}
    cfg = base.replace(gpus=4, batch_size=8)
    study.enqueue_trial(config_params(cfg, s))
    assert suggest(study.ask(), s, base) == cfg
