"""core/config.py's global batch and lr rule, and core/training.py's account of what a config changes."""

from __future__ import annotations

import math

import pytest

from autotune.core.config import BASELINE, TrialConfig, baseline_of, lr_factor
from autotune.core.settings import parse_percent
from autotune.core.errors import ConfigError
from autotune.core.training import section, shown, training_math


def test_grad_accum_is_derived_from_the_global_batch() -> None:
    cfg = TrialConfig(batch_size=2, gpus=2, global_batch=16)
    assert cfg.grad_accum == 4 and cfg.global_batch_size == 16 and cfg.effective_lr == cfg.lr
    free = TrialConfig(batch_size=64)
    assert free.grad_accum == 1 and free.global_batch_size == 64


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(batch_size=3, global_batch=16), "not a multiple of batch_size x gpus"),
        (dict(batch_size=8, gpus=4, global_batch=16), "not a multiple"),
        (dict(global_batch=0, batch_size=1), "global_batch must be >= 1"),
        (dict(lr_scaling="cubic"), "lr_scaling must be one of sqrt|linear|none"),
    ],
)
def test_bad_global_batch_or_rule_is_a_config_error(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrialConfig(**kw)


@pytest.mark.parametrize("rule, factor", [("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_lr_follows_the_rule_for_a_changed_global_batch(rule: str, factor: float) -> None:
    cfg = TrialConfig(batch_size=32, lr=1e-3, lr_scaling=rule)  # 32 vs the reference 8
    assert math.isclose(cfg.effective_lr, 1e-3 * factor) and lr_factor(4.0, rule) == factor


def test_baseline_of_accumulates_up_to_the_study_global_batch() -> None:
    """--global-batch is for a batch that may not fit in one pass: the baseline runs the plain batch and
    accumulates, never all N samples at once."""
    assert baseline_of(TrialConfig(batch_size=64, precision="bf16")).knobs() == BASELINE.knobs()
    fixed = baseline_of(TrialConfig(batch_size=4, global_batch=32, num_workers=2))
    assert fixed.batch_size == 8 and fixed.grad_accum == 4 and fixed.num_workers == 0
    assert baseline_of(TrialConfig(batch_size=12, global_batch=12)).batch_size == 6  # the largest divisor <= 8
    assert baseline_of(TrialConfig(batch_size=4, global_batch=4)).batch_size == 4


def test_a_user_baseline_is_what_every_config_is_compared_with() -> None:
    cfg = TrialConfig(batch_size=32, baseline={"batch_size": 16, "num_workers": 4, "precision": "bf16"})
    base = baseline_of(cfg)
    assert (base.batch_size, base.num_workers, base.precision, base.optimizer_fusion) == (16, 4, "bf16", "none")
    assert cfg.reference_batch == 16  # lr is meant for the user's batch
    assert training_math(cfg, batch_norm=False) == [
        "global batch 16 -> 32",
        "lr 0.001 -> 0.00141 (sqrt rule)",
        "precision bf16 -> fp32",
    ]
    assert TrialConfig.from_dict(cfg.workload()).baseline == (
        ("batch_size", 16),
        ("num_workers", 4),
        ("precision", "bf16"),
    )
    with pytest.raises(ConfigError, match="baseline: unknown knob"):
        TrialConfig(baseline={"lr": 1.0})


def test_training_math_lists_each_change_and_nothing_for_speed_knobs() -> None:
    speed_only = TrialConfig(num_workers=2, optimizer_fusion="fused", channels_last=True, checkpoint_segments=2)
    assert training_math(speed_only, batch_norm=True) == [] and shown([]) == "same"
    changes = training_math(TrialConfig(batch_size=64, precision="bf16"), batch_norm=True)
    assert changes == [
        "global batch 8 -> 64",
        "lr 0.001 -> 0.00283 (sqrt rule)",
        "precision fp32 -> bf16",
        "batch-norm span 8 -> 64",
    ]
    micro = TrialConfig(batch_size=2, global_batch=8)  # the same step, but batch norm sees 2 samples
    assert training_math(micro, batch_norm=True) == ["batch-norm span 8 -> 2"]
    assert training_math(micro, batch_norm=False) == []
    assert shown(None) == "?"


def test_section_says_what_to_do_when_training_differs() -> None:
    s = section(TrialConfig(batch_size=64), ["global batch 8 -> 64"])
    assert s["verdict"] == "differs" and s["grad_accum"] == 1 and s["baseline_global_batch"] == 8
    assert "--global-batch 8" in str(s["advice"]) and math.isclose(float(s["lr"]), 1e-3 * math.sqrt(8))
    same = section(TrialConfig(), [])
    assert same["verdict"] == "same" and "advice" not in same


@pytest.mark.parametrize("text, value", [("10%", 0.1), ("0.25", 0.25), ("0%", 0.0)])
def test_parse_percent(text: str, value: float) -> None:
    assert parse_percent(text, "--memory-headroom") == pytest.approx(value)


def test_parse_percent_refuses_words() -> None:
    with pytest.raises(ConfigError, match="--memory-headroom 'lots'"):
        parse_percent("lots", "--memory-headroom")


def test_fsdp_mixed_precision_changes_the_training_math_only_when_fsdp_runs() -> None:
    """A bf16 reduce sums the ranks' gradients in bf16: numerics change, the step does not (parity)."""
    from autotune.core.training import changes_step

    fsdp = TrialConfig(gpus=2, batch_size=4, global_batch=8, parallel="fsdp")
    assert training_math(fsdp, batch_norm=False) == []  # sharding at fp32 computes the same step
    assert training_math(fsdp.replace(fsdp_reshard=False, fsdp_offload=True), batch_norm=False) == []
    changes = training_math(fsdp.replace(fsdp_reduce_dtype="bf16", fsdp_param_dtype="bf16"), batch_norm=False)
    assert changes == ["fsdp param dtype fp32 -> bf16", "gradient reduce fp32 -> bf16"]
    assert not changes_step(fsdp.replace(fsdp_reduce_dtype="bf16", fsdp_param_dtype="bf16"))
    assert changes_step(TrialConfig(batch_size=16))  # a free global batch: 8 -> 16, another step
    # Not in effect, not a change: DDP, or one process.
    assert training_math(fsdp.replace(parallel="ddp", fsdp_reduce_dtype="bf16"), batch_norm=False) == []
    assert training_math(TrialConfig(parallel="fsdp", fsdp_reduce_dtype="bf16"), batch_norm=False) == []
