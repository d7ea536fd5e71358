"""Parity (autotune/search/checks/parity.py): the candidate trains side by side with the baseline from the same
weights on the same data order, and fails when its loss trajectory strays further from the baseline's
than a fraction of what a reshuffle of the data does. bf16 on the Unet passes; a model whose numerics
break in bf16 without a NaN fails; accumulation that keeps the global batch passes; a crash is a fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.core.config import TrialConfig
from autotune.pipelines import preload_modules
from autotune.search.checks import parity
from autotune.trial.processes.warm_client import DEFAULT_PRELOAD, WarmServer

K = 30
TIMEOUT_S = 300.0
# One intra-op thread everywhere: on a shared 2-core machine two contending threads run a step several
# times slower. The offset pipeline is healthy in fp32 (its baseline and twin) and broken in bf16.
RULE = TrialConfig(pipeline="tests.parity_pipelines:offset", image_size=64, batch_size=8, global_batch=8, num_threads=1)
# conftest's `server` fixture: one warm server for every trial here, a fork per run.
WARM_PRELOAD = (*DEFAULT_PRELOAD, *preload_modules("unet"), "tests.parity_pipelines")


# --- the metric, no processes -------------------------------------------------------------------


def test_deviation_is_zero_for_the_same_trajectory_and_a_ratio_of_mean_differences() -> None:
    base = [2.0 - 0.05 * i for i in range(K)]
    assert parity.deviation(base, 8, base, 8, K * 8) == 0.0
    # Shifted by 0.1 everywhere: mean |diff| 0.1 over the mean smoothed baseline level.
    level = sum(parity.smoothed(base, 8, range(8, K * 8 + 1, 8), parity.SMOOTH * 8)) / K
    assert parity.deviation([x + 0.1 for x in base], 8, base, 8, K * 8) == pytest.approx(0.1 / level)
    # Smoothing: alternating batch difficulty (+-0.2) mostly averages out, unsmoothed it would be 0.2 / level.
    noisy = [x + (0.2 if i % 2 else -0.2) for i, x in enumerate(base)]
    assert parity.deviation(noisy, 8, base, 8, K * 8) < 0.2 / level / 3
    assert parity.deviation(noisy, 8, base, 8, K * 8, smooth=1) == pytest.approx(0.2 / (sum(base) / K))


def test_a_larger_global_batch_is_compared_at_equal_samples_seen() -> None:
    # Batch 8 for 240 steps; batch 64 whose every step's loss is the mean of the 8 small steps that saw
    # the same samples: equal at equal samples seen, so no deviation, though step by step they differ.
    small = [3.0 / (1 + 0.05 * i) for i in range(8 * K)]
    large = [sum(small[8 * j : 8 * j + 8]) / 8 for j in range(K)]
    assert parity.deviation(large, 64, small, 8, 64 * K) == pytest.approx(0.0, abs=1e-12)
    assert parity.deviation(large, 8, small[:K], 8, 8 * K) > 0.5  # what step by step would say
    with pytest.raises(ValueError, match="do not cover"):
        parity.deviation(large, 64, small[:K], 8, 64 * K)


def test_the_tolerance_is_a_fraction_of_the_noise_with_a_floor() -> None:
    assert 0 < parity.FRACTION <= 1
    assert parity.tolerance_for(0.04) == pytest.approx(parity.FRACTION * 0.04) and 0.04 * parity.FRACTION > parity.FLOOR
    assert parity.tolerance_for(0.0) == parity.FLOOR > 0


def test_a_parity_result_and_the_reference_are_json() -> None:
    v = parity.ParityResult(
        steps=K,
        samples=8 * K,
        deviation=0.0123456789,
        tolerance=0.02,
        noise=0.04,
        passed=True,
        reason="loss trajectory within 1.2% ...",
        seconds=12.34,
        runs=1,
    )
    d = json.loads(json.dumps(v.to_dict()))
    assert {"steps", "deviation", "tolerance", "verdict", "reason", "seconds", "noise"} <= set(d)
    assert d["verdict"] == "pass" and d["deviation"] == pytest.approx(0.012346) and d["steps"] == K
    ref = parity.Reference(parity.as_run(RULE, 3), 3, (0.7, 0.6, 0.5), (0.7, 0.65, 0.5), 1.0)
    again = parity.Reference.from_dict(json.loads(json.dumps(ref.to_dict())))
    assert again == ref and again.noise == ref.noise > 0 and again.samples == 24


def test_a_reference_of_another_baseline_is_refused(tmp_path: Path) -> None:
    ref = parity.Reference(parity.as_run(RULE, K), K, (0.7,) * K, (0.7,) * K, 1.0)
    with pytest.raises(ValueError, match="another baseline"):
        parity.check(RULE, RULE.replace(seed=1), K, tmp_path, TIMEOUT_S, reference=ref)


# --- real trials ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rule_ref(server: WarmServer, tmp_path_factory: pytest.TempPathFactory) -> parity.Reference:
    return parity.noise_reference(RULE, K, tmp_path_factory.mktemp("rule-ref"), TIMEOUT_S, server)


def candidate_losses(folder: Path) -> list[float]:
    return json.loads((folder / "candidate" / "result.json").read_text())["losses"]


def test_the_baseline_against_itself_deviates_by_exactly_zero(
    rule_ref: parity.Reference, server: WarmServer, tmp_path: Path
) -> None:
    assert len(rule_ref.losses) == K and rule_ref.losses != rule_ref.twin_losses  # the twin saw other data
    assert rule_ref.losses[0] > rule_ref.losses[-1] + 0.1  # it learns
    assert 0 < rule_ref.noise < 0.2
    v = parity.check(RULE, RULE, K, tmp_path, TIMEOUT_S, server, reference=rule_ref)
    assert v.deviation == 0.0 and v.passed and v.runs == 1  # CPU fp32 with one seed: bitwise identical
    assert v.noise == pytest.approx(rule_ref.noise) and v.tolerance == pytest.approx(parity.tolerance_for(v.noise))


def test_numerics_that_break_in_bf16_without_nan_fail(
    rule_ref: parity.Reference, server: WarmServer, tmp_path: Path
) -> None:
    v = parity.check(RULE.replace(precision="bf16"), RULE, K, tmp_path, TIMEOUT_S, server, reference=rule_ref)
    losses = candidate_losses(tmp_path)
    assert len(losses) == K and all(math.isfinite(x) for x in losses)  # nothing a NaN guard would see
    assert max(losses) - min(losses) < 0.01  # it stalled
    assert not v.passed and v.failure is None and v.deviation is not None and v.tolerance is not None
    assert v.deviation > 5 * v.tolerance and v.deviation > 10 * v.noise  # worse than a reshuffle, by far
    assert "deviates" in v.reason and f"{v.deviation:.1%}" in v.reason
    assert v.to_dict()["verdict"] == "fail"


def test_accumulated_micro_batches_of_the_same_global_batch_pass(
    rule_ref: parity.Reference, server: WarmServer, tmp_path: Path
) -> None:
    v = parity.check(RULE.replace(batch_size=4), RULE, K, tmp_path, TIMEOUT_S, server, reference=rule_ref)
    assert v.passed and v.runs == 1 and v.candidate_steps == K and v.samples == 8 * K
    assert v.deviation is not None and v.deviation < 1e-3  # the same step up to rounding (no batch norm)


def test_a_candidate_that_crashes_is_a_failed_verdict(
    rule_ref: parity.Reference, server: WarmServer, tmp_path: Path
) -> None:
    crash = RULE.replace(pipeline="tests.parity_pipelines:crashes_in_bf16", precision="bf16")
    v = parity.check(crash, RULE, K, tmp_path, TIMEOUT_S, server, reference=rule_ref)
    assert not v.passed and v.failure == "crash" and v.deviation is None and v.runs == 1
    assert "failed to train" in v.reason and "bf16" in v.reason
    assert v.tolerance == pytest.approx(parity.tolerance_for(rule_ref.noise))
    assert v.to_dict()["verdict"] == "fail" and v.to_dict()["failure"] == "crash"


def test_a_larger_global_batch_gets_a_reference_covering_its_samples(server: WarmServer, tmp_path: Path) -> None:
    base = TrialConfig(pipeline="tests.parity_pipelines:healthy", image_size=64, batch_size=8, num_threads=1)
    short = parity.noise_reference(base, 5, tmp_path / "short", TIMEOUT_S, server)  # 40 samples: too few
    v = parity.check(base.replace(batch_size=16), base, 5, tmp_path / "check", TIMEOUT_S, server, reference=short)
    assert v.runs == 3 and v.candidate_steps == 5 and v.baseline_steps == 10 and v.samples == 80
    assert "equal samples seen (global batch 8 -> 16" in v.reason
    assert v.deviation is not None and v.noise is not None and v.deviation > 0 and v.noise > 0


def test_bf16_on_the_unet_passes(server: WarmServer, tiny_data: Path, tmp_path: Path) -> None:
    base = TrialConfig(image_size=64, batch_size=4, data_dir=str(tiny_data), num_threads=1)
    # 10 steps keep it short; bf16 measured 0.29-0.40 x the noise over 10-20 steps here, 0.14-0.20 over 30
    # (benchmarks/parity.py).
    ref = parity.noise_reference(base, 10, tmp_path / "ref", TIMEOUT_S, server)
    v = parity.check(base.replace(precision="bf16"), base, 10, tmp_path / "bf16", TIMEOUT_S, server, reference=ref)
    assert v.passed, v.reason
    assert v.noise is not None and v.noise > parity.FLOOR  # the twin saw other data
    assert v.deviation is not None and 0 < v.deviation < v.noise  # bf16 rounds differently, less than a reshuffle


# --- what a reference cannot judge: not checkable, never a pass at the floor ---------------------------------

SCRIPTS = Path(__file__).parents[2] / "pipelines" / "scripts"
LOOP_SCRIPTS = Path(__file__).parents[2] / "trial" / "loop" / "script" / "scripts"


def script_base(path: Path, *args: str) -> TrialConfig:
    from autotune.pipelines import script

    return TrialConfig(
        pipeline=script.spec_of(str(path), list(args)), num_threads=1, warmup_steps=0, timed_steps=8, window=1
    )


def test_a_script_whose_data_order_follows_no_seed_is_not_checkable(server: WarmServer, tmp_path: Path) -> None:
    """No at.data_seed() and no DataLoader: the data-order twin trains the baseline's own batches (noise
    0.00%), so nothing sets a tolerance: not checked, with what to write, and no candidate run."""
    base = script_base(SCRIPTS / "no_loader.py", "--steps", "1000")
    ref = parity.noise_reference(base, 8, tmp_path / "reference", TIMEOUT_S, server)
    assert ref.not_checkable and "trained on the baseline's own batches" in ref.not_checkable
    assert "at.data_seed(0)" in ref.not_checkable
    assert parity.Reference.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref
    v = parity.check(base.replace(optimizer_fusion="foreach"), base, 8, tmp_path / "c", TIMEOUT_S, server, ref)
    d = v.to_dict()
    assert d["verdict"] == "not checked" and d["reason"].startswith("not checkable: the data-order twin")
    assert v.runs == 0 and not (tmp_path / "c" / "candidate").exists()


def test_optimizer_fusion_alone_on_an_unseeded_script_is_not_failed_by_parity(
    server: WarmServer, tmp_path: Path
) -> None:
    """A script that seeds torch only under a flag it was not given: its source calls manual_seed, its run
    does not. A same-math config (fused AdamW) is not judged against a tolerance drawn from unseeded runs:
    not checkable, so the export may take it on its measurement (docs/same-training.md)."""
    base = script_base(LOOP_SCRIPTS / "seed_flag.py")
    ref = parity.noise_reference(base, 8, tmp_path / "reference", TIMEOUT_S, server)
    assert ref.not_checkable == parity.UNSEEDED
    v = parity.check(base.replace(optimizer_fusion="fused"), base, 8, tmp_path / "c", TIMEOUT_S, server, ref)
    assert v.to_dict()["verdict"] == "not checked" and "never seeded torch" in v.reason
    # Given its seed, the same script is checkable, and the fused step passes against the data-order noise.
    seeded = script_base(LOOP_SCRIPTS / "seed_flag.py", "--seed", "0")
    ref = parity.noise_reference(seeded, 8, tmp_path / "seeded", TIMEOUT_S, server)
    assert ref.not_checkable is None and ref.noise > 0
    v = parity.check(seeded.replace(optimizer_fusion="fused"), seeded, 8, tmp_path / "s", TIMEOUT_S, server, ref)
    assert v.to_dict()["verdict"] == "pass", v.reason
