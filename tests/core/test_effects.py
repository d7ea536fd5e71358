"""autotune/core/effects.py: the one record of a knob's effect, the lr's record for autotune's own lr and for a
job's own, and the one refusal of a knob a job cannot honour, in the words every kind of trial writes."""

from __future__ import annotations

import pytest

from autotune.core.config import TrialConfig
from autotune.core.effects import knob_effect, lr_effect, refuse_unsupported, unsupported_effects
from autotune.core.errors import TrialUnsupported


class Why(frozenset):  # a job's unsupported knobs, with why (as pipelines.Unsupported carries them)
    why = {"channels_last": "its convs are 1-D"}


def test_a_record_says_why_only_when_there_is_something_to_say() -> None:
    assert knob_effect(2, 2) == {"requested": 2, "in_effect": 2}
    assert list(knob_effect(True, False, "no CUDA")) == ["requested", "in_effect", "why"]


def test_autotune_s_own_lr_is_scaled_from_the_reference_batch() -> None:
    assert lr_effect(TrialConfig(lr=0.1), 0.1, 0.1) == {"requested": 0.1, "in_effect": 0.1}
    cfg = TrialConfig(lr=0.1, batch_size=32)  # global batch 32 against the reference 8, sqrt rule
    assert lr_effect(cfg, cfg.lr, cfg.effective_lr) == {
        "requested": 0.1,
        "in_effect": pytest.approx(0.2),
        "why": "sqrt rule: global batch 32 vs the 8 that lr is given for",
    }


def test_a_job_s_own_lr_is_scaled_from_its_own_batch() -> None:
    same = lr_effect(TrialConfig(batch_size=32), [0.01], [0.01], own_batch=32)
    assert same["why"] == "the pipeline's own learning rate (its global batch 32)"
    scaled = lr_effect(TrialConfig(batch_size=8), [0.01], [0.005], own_batch=32)
    assert scaled["why"] == "the pipeline's own lr, meant for its global batch 32, x 0.5: sqrt rule for global batch 8"


def test_a_knob_a_job_cannot_honour_is_refused_only_away_from_its_default() -> None:
    refuse_unsupported(TrialConfig(), Why({"channels_last", "pin_memory"}))  # at their defaults: nothing asked
    with pytest.raises(TrialUnsupported) as e:
        refuse_unsupported(TrialConfig(channels_last=True, pin_memory=True), Why({"channels_last", "pin_memory"}))
    assert str(e.value) == "the pipeline does not support: channels_last (its convs are 1-D), pin_memory"
    assert unsupported_effects(TrialConfig(), Why({"channels_last"})) == {
        "channels_last": {"requested": False, "in_effect": False, "why": "its convs are 1-D"}
    }
