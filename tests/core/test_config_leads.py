"""core/config.py's one rule for dependent knobs: in effect only where their lead turns their `needs` on."""

from __future__ import annotations

import pytest

from autotune.core.config import (
    IN_EFFECT_WHEN,
    INERT_BECAUSE,
    KNOBS,
    LEADS,
    TABLE,
    TrialConfig,
    dependents,
    in_effect,
    inert,
    turns_on,
)

WORKERS = {"persistent_workers", "prefetch_factor"}
FSDP = {"fsdp_reshard", "fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_offload"}


def effective(cfg: TrialConfig) -> set[str]:
    return {k for k in KNOBS if in_effect(k, cfg.knobs())}


def test_the_baseline_has_every_dependent_inert() -> None:
    cfg = TrialConfig()
    assert effective(cfg) == set(KNOBS) - WORKERS - {"parallel"} - FSDP
    assert inert(cfg.knobs()) == {
        "persistent_workers": False,
        "prefetch_factor": None,
        "parallel": "ddp",
        "fsdp_reshard": True,
        "fsdp_param_dtype": "fp32",
        "fsdp_reduce_dtype": "fp32",
        "fsdp_offload": False,
    }


def test_workers_turn_on_the_loader_knobs_alone() -> None:
    cfg = TrialConfig(num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert WORKERS <= effective(cfg) and not ({"parallel"} | FSDP) & effective(cfg)
    assert set(inert(cfg.knobs())) == {"parallel"} | FSDP


def test_fsdp_with_one_process_is_inert() -> None:
    """parallel fsdp turns fsdp on only where parallel itself is in effect: with more than one process."""
    cfg = TrialConfig(parallel="fsdp", fsdp_offload=True)
    assert turns_on("fsdp", cfg.parallel) and not in_effect("fsdp_offload", cfg.knobs())
    assert inert(cfg.knobs())["parallel"] == "ddp" and inert(cfg.knobs())["fsdp_offload"] is False


def test_ddp_over_processes_leaves_the_fsdp_knobs_inert() -> None:
    cfg = TrialConfig(gpus=2, parallel="ddp")
    assert "parallel" in effective(cfg) and not FSDP & effective(cfg)
    assert set(inert(cfg.knobs())) == WORKERS | FSDP


def test_fsdp_over_processes_with_workers_has_every_knob_in_effect() -> None:
    cfg = TrialConfig(gpus=2, parallel="fsdp", num_workers=1, fsdp_reshard=False)
    assert effective(cfg) == set(KNOBS) and inert(cfg.knobs()) == {}


@pytest.mark.parametrize("needs", list(LEADS))
def test_each_needs_is_declared_once_with_its_words(needs: str) -> None:
    """Every `needs` a knob declares has a lead, a when and a why-not; each lead is a knob asked before its
    dependents (suggest asks in KNOBS order and skips a dependent whose lead is off)."""
    assert {k.needs for k in TABLE if k.needs} == set(LEADS) == set(IN_EFFECT_WHEN) == set(INERT_BECAUSE)
    lead = LEADS[needs]
    assert dependents(needs) and all(KNOBS.index(lead) < KNOBS.index(k) for k in dependents(needs))
    assert not turns_on(needs, getattr(TrialConfig(), lead))  # the baseline runs without any of them
