"""A dependent knob is inert where its lead is off, in every step of the space: resolve's notes (their exact
words), suggest's asks, and the enqueued params."""

from __future__ import annotations

import optuna
import pytest

from autotune.core.config import TrialConfig
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware
from autotune.search.space.spec import Choices, Fixed, SearchSpace
from autotune.search.space.suggest import config_params, suggest

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)
GPU4 = Hardware(cuda=True, gpu_count=4, cpu_count=16, apex=False)
DEPENDENTS = {
    "prefetch_factor": Choices((None, 4)),
    "persistent_workers": Choices((False, True)),
    "parallel": Choices(("ddp", "fsdp")),
    "fsdp_reshard": Choices((True, False)),
    "fsdp_offload": Choices((False, True)),
}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_resolve_fixes_each_dependent_of_a_lead_that_stays_off() -> None:
    space = SearchSpace({"num_workers": Fixed(0), "gpus": Choices((1, 2)), **DEPENDENTS})
    narrowed, notes = for_hardware(space, CPU)
    assert notes == [
        "gpus: choices limited to [1] (only 1 device present)",
        "persistent_workers fixed to False: num_workers is 0",
        "prefetch_factor fixed to None: num_workers is 0",
        "parallel fixed to 'ddp': gpus is 1: one process, nothing to replicate or shard",
        "fsdp_reshard fixed to True: parallel is not fsdp",
        "fsdp_offload fixed to False: parallel is not fsdp",
    ]
    assert narrowed.searched() == []


def test_resolve_keeps_the_dependents_a_lead_may_turn_on() -> None:
    space = SearchSpace({"num_workers": Choices((0, 2)), "gpus": Choices((1, 2)), **DEPENDENTS})
    narrowed, notes = for_hardware(space, GPU4)
    assert notes == [] and set(narrowed.searched()) == set(space.knobs)


def test_a_space_without_a_lead_takes_its_default() -> None:
    """num_workers, gpus and parallel left out are 0, 1 and ddp (the base config's defaults, as reading.py reads a file)."""
    narrowed, notes = for_hardware(SearchSpace(dict(DEPENDENTS)), GPU4)
    assert narrowed.searched() == [] and len(notes) == len(DEPENDENTS)


@pytest.mark.parametrize(
    ("base", "asked"),
    [
        (TrialConfig(), []),
        (TrialConfig(num_workers=1), ["persistent_workers", "prefetch_factor"]),
        (TrialConfig(gpus=2, parallel="ddp"), ["parallel"]),
        (TrialConfig(gpus=2, parallel="fsdp"), ["parallel", "fsdp_reshard", "fsdp_offload"]),
    ],
)
def test_suggest_asks_only_what_the_leads_turn_on(base: TrialConfig, asked: list[str]) -> None:
    """With parallel fixed to fsdp in the space, the fsdp knobs are asked whenever there are processes."""
    knobs = {**DEPENDENTS, "parallel": Fixed(base.parallel)} if base.gpus > 1 else DEPENDENTS
    space = SearchSpace(knobs)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    cfg = suggest(trial, space, base)
    assert list(trial.params) == [k for k in asked if k != "parallel"]
    assert list(config_params(cfg, space)) == list(trial.params)
    off = {k: getattr(TrialConfig(), k) for k in DEPENDENTS if k not in asked}
    assert {k: getattr(cfg, k) for k in off} == off
