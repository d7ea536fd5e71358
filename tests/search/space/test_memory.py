"""The memory estimate's arithmetic against figures worked by hand, and the narrowing it drives: a
micro-batch no strategy fits is dropped (and said), a proposal too big is named in one line."""

from __future__ import annotations

import pytest

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.space import memory
from autotune.search.space.machine import Hardware
from autotune.search.space.memory import Fit, ModelFacts, estimate, strategy, versus_peak
from autotune.search.space.resolve import by_memory as narrow
from autotune.search.space.spec import Choices, Fixed, SearchSpace

# 1M parameters, 800k of them in blocks (the largest 200k); 1 MB saved per sample, 300 kB inside each
# of 2 stages, which take 10 kB inputs; 100 kB saved before the first stage, 400 kB before the second.
FACTS = ModelFacts(
    param_count=1_000_000,
    largest_block_params=200_000,
    blocks_param_count=800_000,
    activation_bytes_per_sample=1_000_000,
    stage_activation_bytes=(300_000, 300_000),
    stage_input_bytes=(10_000, 10_000),
    stage_before_bytes=(100_000, 400_000),
    device="cuda",
)
CFG = TrialConfig(batch_size=4)


def parts(cfg: TrialConfig, facts: ModelFacts = FACTS) -> tuple[int, int, int, int, int]:
    e = estimate(cfg, facts)
    return e.params, e.grads, e.optimizer, e.activations, e.total


def test_one_process_holds_fp32_weights_grads_two_adam_tensors_and_the_activations() -> None:
    assert parts(CFG) == (4_000_000, 4_000_000, 8_000_000, 4_000_000, 20_000_000)


def test_ddp_adds_its_gradient_buckets() -> None:
    assert parts(CFG.replace(gpus=2)) == (4_000_000, 8_000_000, 8_000_000, 4_000_000, 24_000_000)


def test_fsdp_shards_the_state_and_gathers_two_blocks_and_the_root() -> None:
    # sharded: 4 MB / 2; gathered: root 200k + 2 x 200k blocks, fp32; grads: the shard + root and one block
    fsdp = CFG.replace(gpus=2, parallel="fsdp")
    assert parts(fsdp) == (2_000_000 + 2_400_000, 2_000_000 + 1_600_000, 4_000_000, 4_000_000, 16_000_000)


def test_fsdp_without_reshard_keeps_the_whole_model_gathered() -> None:
    assert parts(CFG.replace(gpus=2, parallel="fsdp", fsdp_reshard=False))[0] == 2_000_000 + 4_000_000


def test_fsdp_bf16_params_halve_the_gathered_copies_and_the_activations() -> None:
    bf16 = CFG.replace(gpus=2, parallel="fsdp", fsdp_param_dtype="bf16")
    assert parts(bf16)[:4] == (2_000_000 + 1_200_000, 2_000_000 + 800_000, 4_000_000, 2_000_000)


def test_offload_moves_the_sharded_state_to_the_host_on_cuda_only() -> None:
    off = CFG.replace(gpus=4, parallel="fsdp", fsdp_offload=True)
    assert parts(off)[:3] == (2_400_000, 1_600_000, 0)
    on_cpu = ModelFacts(**{**FACTS.to_dict(), "device": "cpu"})  # host memory is the same memory there
    assert parts(off, on_cpu)[:3] == (1_000_000 + 2_400_000, 1_000_000 + 1_600_000, 2_000_000)


def test_one_process_ignores_the_parallel_knobs() -> None:
    assert parts(CFG.replace(parallel="fsdp", fsdp_offload=True)) == parts(CFG)
    assert strategy(CFG.replace(parallel="fsdp")) == "one process"
    assert strategy(CFG.replace(gpus=4, parallel="fsdp", fsdp_param_dtype="bf16")) == "fsdp x4 (bf16 params)"


def test_autocast_halves_and_the_micro_batch_scales_the_activations() -> None:
    assert estimate(CFG.replace(precision="bf16"), FACTS).activations == 2_000_000
    assert estimate(CFG.replace(batch_size=8), FACTS).activations == 8_000_000


def test_checkpointing_keeps_the_inputs_and_recomputes_one_stage_at_a_time() -> None:
    # 1 stage: end of forward 1M - 300k + 10k = 710k; recomputing it: 100k + 10k + 300k = 410k -> 710k
    assert estimate(CFG.replace(checkpoint_segments=1), FACTS).activations == 4 * 710_000
    # 2 stages: end of forward 1M - 580k = 420k; recomputing the second: 400k - 290k + 10k + 300k = 420k
    assert estimate(CFG.replace(checkpoint_segments=2), FACTS).activations == 4 * 420_000
    no_stages = ModelFacts(**{**FACTS.to_dict(), "stage_activation_bytes": []})
    assert estimate(CFG.replace(checkpoint_segments=2), no_stages).activations == 4_000_000


def test_the_process_itself_counts_on_a_cpu_only() -> None:
    cpu = ModelFacts(**{**FACTS.to_dict(), "device": "cpu", "runtime_bytes": 500})
    assert estimate(CFG, cpu).total == 20_000_500
    assert estimate(CFG, ModelFacts(**{**cpu.to_dict(), "device": "cuda"})).total == 20_000_000


def test_facts_round_trip_through_json_shapes() -> None:
    assert ModelFacts.from_dict(FACTS.to_dict() | {"unknown": 1}) == FACTS


def test_versus_peak_gives_the_error_as_a_share_of_the_peak() -> None:
    row = versus_peak(estimate(CFG, FACTS).to_dict(), 25_000_000)
    assert row is not None and row["error"] == pytest.approx(-0.2) and row["total_bytes"] == 20_000_000
    assert versus_peak(None, 1) is None and versus_peak(estimate(CFG, FACTS).to_dict(), None) is None


def test_a_proposal_too_big_is_named_in_one_line() -> None:
    fit = Fit(FACTS, usable=22_000_000, cuda=True)
    assert fit.too_big(CFG) is None  # 20 MB
    line = fit.too_big(CFG.replace(gpus=2))  # 24 MB under DDP
    assert line is not None and line.startswith("batch 4 under ddp x2: estimated") and line.endswith("usable; skipped")


def test_cpu_ranks_share_one_ram() -> None:
    fit = Fit(FACTS, usable=30_000_000, cuda=False)
    assert fit.too_big(CFG) is None
    assert "for 2 ranks sharing the RAM" in (fit.too_big(CFG.replace(gpus=2)) or "")  # 2 x 24 MB


def test_narrowing_drops_the_batches_no_strategy_fits_and_says_so() -> None:
    space = SearchSpace({"batch_size": Choices((4, 8, 16, 32)), "gpus": Choices((1, 2))})
    # 16 MB of state + 1 MB a sample on one process (the least here; DDP adds buckets): 30 MB fits 8 and 4
    narrowed, notes = narrow(space, TrialConfig(), Fit(FACTS, usable=30_000_000, cuda=True))
    assert narrowed["batch_size"] == Choices((4, 8))
    assert notes == [
        f"batch_size: dropped {b} (batch {b}: estimated {s} per rank even under one process, > 0.03 GiB usable)"
        for b, s in ((16, "0.03 GiB"), (32, "0.04 GiB"))
    ]


def test_narrowing_counts_every_strategy_the_space_offers() -> None:
    # FSDP over 4 ranks with bf16 params and offload keeps 1.2 MB + 0.8 MB on the GPU, + 0.5 MB a sample in bf16
    space = SearchSpace({"batch_size": Choices((8, 32)), "gpus": Fixed(4), "precision": Choices(("fp32", "bf16"))})
    fit = Fit(FACTS, usable=20_000_000, cuda=True)
    base = TrialConfig(parallel="fsdp", fsdp_param_dtype="bf16", fsdp_offload=True)
    assert narrow(space, base, fit) == (space, [])
    narrowed, notes = narrow(space, TrialConfig(), fit)  # DDP only: 20 MB of state alone
    assert narrowed["batch_size"] == Fixed(8) and len(notes) == 1  # the baseline's batch is never dropped


def test_a_measured_peak_calibrates_the_process_share() -> None:
    cpu = Fit(ModelFacts(**{**FACTS.to_dict(), "device": "cpu", "runtime_bytes": 800}), usable=10**9, cuda=False)
    before = estimate(CFG, cpu.facts)
    after = cpu.calibrated(before.to_dict(), peak=20_000_300)  # 20 MB of parts, so the process holds 300
    assert after.facts.runtime_bytes == 300 and estimate(CFG, after.facts).total == 20_000_300
    assert after.usable == cpu.usable and cpu.facts.runtime_bytes == 800  # a new Fit; the old one unchanged


# --- ranks sharing a GPU (AUTOTUNE_DDP_BACKEND=gloo: rank r on GPU r mod count) ---------------------


def test_ranks_sharing_a_gpu_count_together_against_it() -> None:
    shared = Fit(FACTS, usable=30_000_000, cuda=True, devices=1, shared=True)
    line = shared.too_big(CFG.replace(gpus=2))  # 2 x 24 MB on the one GPU
    assert line == "batch 4 under ddp x2: estimated 0.04 GiB for 2 ranks sharing one GPU > 0.03 GiB usable; skipped"
    assert Fit(FACTS, usable=30_000_000, cuda=True, devices=1).too_big(CFG.replace(gpus=2)) is None  # nccl: one each
    assert Fit(FACTS, usable=30_000_000, cuda=True, devices=2, shared=True).too_big(CFG.replace(gpus=2)) is None
    assert shared.per_device(3) == 3 and Fit(FACTS, 1, cuda=True, devices=2, shared=True).per_device(3) == 2


def test_narrowing_counts_the_ranks_on_one_gpu() -> None:
    space = SearchSpace({"batch_size": Choices((4, 8)), "gpus": Fixed(2)})
    narrowed, notes = narrow(space, TrialConfig(), Fit(FACTS, usable=30_000_000, cuda=True, devices=1, shared=True))
    assert narrowed["batch_size"] == Fixed(8)  # the baseline's stays, measured whatever its estimate
    assert notes == [
        "batch_size: dropped 4 (batch 4: estimated 0.04 GiB for 2 ranks sharing one GPU even under ddp x2, "
        "> 0.03 GiB usable)"
    ]


def test_an_estimate_for_ranks_sharing_a_gpu_is_held_against_the_device_s_peak() -> None:
    # The worker reports the device's peak, both ranks' together: 2 x 24 MB, as estimated.
    recorded = Fit(FACTS, usable=10**9, cuda=True, devices=1, shared=True).recorded(
        estimate(CFG.replace(gpus=2), FACTS), 2
    )
    assert recorded["ranks_per_gpu"] == 2 and recorded["total"] == 24_000_000  # the parts stay one rank's
    row = versus_peak(recorded, 48_000_000)
    assert row is not None and row["error"] == 0.0 and row["strategy"] == "ddp x2, 2 ranks per GPU"
    alone = Fit(FACTS, usable=10**9, cuda=True, devices=2).recorded(estimate(CFG.replace(gpus=2), FACTS), 2)
    assert "ranks_per_gpu" not in alone and versus_peak(alone, 24_000_000)["error"] == 0.0  # type: ignore[index]
    cpu = Fit(FACTS, usable=10**9, cuda=False).recorded(estimate(CFG.replace(gpus=2), FACTS), 2)
    assert "ranks_per_gpu" not in cpu  # a CPU rank's peak is its own RSS


@pytest.mark.parametrize(
    "spec, noun", [("script:/jobs/train.py --epochs 1", "a user's script"), ("lightning:jobs:make", "a framework")]
)
def test_a_job_that_builds_its_model_in_its_own_loop_is_not_probed(
    monkeypatch: pytest.MonkeyPatch, spec: str, noun: str
) -> None:
    """Its kind says the model cannot be built apart: said, and no probe process is started for nothing."""
    monkeypatch.setenv(memory.MEMORY_PROBE_ENV, "1")
    monkeypatch.setattr(memory, "run_probe", lambda *a: pytest.fail("a job that owns its loop is never probed"))
    hw = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False, cpu_bf16=False, memory_bytes=2**30)
    said: list[str] = []
    assert memory.probe_fit(SearchSettings(), TrialConfig(pipeline=spec), hw, said.append) is None
    assert len(said) == 1 and said[0].startswith(f"memory: {noun}") and "builds its model in its own loop" in said[0]
