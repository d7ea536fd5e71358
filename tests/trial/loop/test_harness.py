"""autotune/trial/loop/harness.py: build() applies every knob and says what it applied; step() really trains."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from autotune.core.config import KNOBS, TrialConfig
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop import harness
from autotune.trial.loop.knobs import checkpoint_segments
from autotune.trial.measurement.clock import NonFiniteLoss

TINY = "tests.fault_pipelines:tiny"

pytestmark = pytest.mark.usefixtures("repo_on_path", "one_thread")


def cfg(**kw: Any) -> TrialConfig:
    return TrialConfig(**{"pipeline": TINY, "batch_size": 4, **kw})


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_step_returns_a_finite_loss_and_moves_the_weights() -> None:
    h = harness.build(cfg())
    stream = h.batches()
    before = params(h.model)
    loss = h.step(next(stream))
    assert isinstance(loss, float) and math.isfinite(loss) and loss > 0  # BCE of random labels: about 0.69
    after = params(h.model)
    assert all(not torch.equal(a, b) for a, b in zip(before, after))  # every parameter took a step
    assert all(p.grad is None for p in h.model.parameters())  # set_to_none=True: gradients dropped


def test_step_keeps_zeroed_gradients_without_set_to_none() -> None:
    h = harness.build(cfg(set_to_none=False))
    h.step(next(h.batches()))
    grads = [p.grad for p in h.model.parameters()]
    assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads)
    assert h.applied["set_to_none"] == {"requested": False, "in_effect": False}


def test_repeated_steps_fit_a_fixed_batch() -> None:
    h = harness.build(cfg(lr=1e-2))
    batch = next(h.batches())
    losses = [h.step(batch) for _ in range(15)]
    assert losses[-1] < losses[0], losses  # the optimizer really descends


def test_same_seed_same_first_step_and_other_seed_differs() -> None:
    a, b, c = (harness.build(cfg(seed=s)) for s in (0, 0, 1))
    la, lb, lc = (h.step(next(h.batches())) for h in (a, b, c))
    assert la == lb
    assert lc != la
    assert all(torch.equal(x, y) for x, y in zip(params(a.model), params(b.model)))


@pytest.mark.parametrize("endless", [True, False])  # a trial's endless sampler, train's seeded epochs
def test_loading_items_in_this_process_leaves_the_cuda_generators_alone(
    monkeypatch: pytest.MonkeyPatch, endless: bool
) -> None:
    """num_workers=0: each item's seed is drawn in the training process. Reseeding CUDA there (which
    torch.manual_seed does, and fork_rng(devices=[]) does not undo) would restart the GPU's dropout stream
    at every sample, so the masks would depend on num_workers. CUDA's seeding, faked: none here."""
    h = harness.build(cfg(), endless=endless)
    assert h.loader.num_workers == 0 and getattr(h.loader.dataset, "takes_seeds", False)
    reseeded: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseeded.append)
    next(h.batches())
    assert reseeded == []


def test_an_items_seed_still_draws_its_augmentations() -> None:
    with harness.seeded(7):
        a = torch.rand(3)
    with harness.seeded(7):
        b = torch.rand(3)
    with harness.seeded(8):
        c = torch.rand(3)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_nan_loss_raises() -> None:
    h = harness.build(cfg(pipeline="tests.fault_pipelines:nan"))
    with pytest.raises(NonFiniteLoss, match="nan"):
        h.step(next(h.batches()))


def test_checkpointed_stages_still_train() -> None:
    h = harness.build(cfg(checkpoint_segments=2))
    assert all(isinstance(h.model.get_submodule(s), checkpoint_segments.CheckpointedStage) for s in ("0", "2"))
    assert h.applied["checkpoint_segments"] == {"requested": 2, "in_effect": ["0", "2"]}
    before = params(h.model)
    assert math.isfinite(h.step(next(h.batches())))
    assert all(not torch.equal(a, b) for a, b in zip(before, params(h.model)))  # gradients reached every stage


def test_more_segments_than_stages_is_unsupported() -> None:
    with pytest.raises(TrialUnsupported, match="checkpoint_segments=3"):
        harness.build(cfg(checkpoint_segments=3))


def test_applied_records_every_knob_as_requested() -> None:
    c = cfg(
        num_workers=1,
        pin_memory=True,
        precision="bf16",
        optimizer_fusion="foreach",
        checkpoint_segments=1,
        channels_last=True,
        cudnn_benchmark=True,
        persistent_workers=True,
        prefetch_factor=3,
        num_threads=1,
        set_to_none=False,
    )
    h = harness.build(c)
    missing = set(KNOBS) - set(h.applied)
    assert not missing, missing
    for k in KNOBS:
        assert h.applied[k]["requested"] == getattr(c, k), k
        assert "in_effect" in h.applied[k], k


def test_applied_says_what_really_took_effect_on_cpu() -> None:
    c = cfg(
        num_workers=1,
        pin_memory=True,
        precision="bf16",
        optimizer_fusion="foreach",
        channels_last=True,
        cudnn_benchmark=True,
        persistent_workers=True,
        prefetch_factor=3,
        num_threads=1,
    )
    h = harness.build(c)
    a = h.applied
    assert h.device == torch.device("cpu") and (h.rank, h.world) == (0, 1)
    assert a["pin_memory"]["in_effect"] is False and "no CUDA" in a["pin_memory"]["why"]  # nothing to pin for
    assert a["cudnn_benchmark"]["in_effect"] is False
    assert a["num_threads"]["in_effect"] == 1 == torch.get_num_threads()
    assert a["num_workers"]["in_effect"] == 1 == h.loader.num_workers
    assert a["persistent_workers"]["in_effect"] is True and h.loader.persistent_workers
    assert a["prefetch_factor"]["in_effect"] == 3 == h.loader.prefetch_factor
    assert a["batch_size"]["in_effect"] == 4 == h.loader.batch_size
    assert (
        a["precision"]["in_effect"] == "bf16"
        and "autocast(cpu, bf16)" in a["precision"]["why"]
        and a["grad_scaler"] is False
    )
    assert isinstance(h.optimizer, torch.optim.AdamW) and h.optimizer.defaults["foreach"] is True
    assert "foreach" in a["optimizer_fusion"]["in_effect"]
    weight = next(p for p in h.model.parameters() if p.dim() == 4)
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert a["gpus"]["in_effect"] == 1


def test_baseline_applied_is_a_plain_script() -> None:
    h = harness.build(cfg())
    a = h.applied
    assert a["precision"]["in_effect"] == "fp32" and a["grad_scaler"] is False and not h.precision.enabled
    assert a["num_workers"]["in_effect"] == 0 and a["prefetch_factor"]["in_effect"] is None
    assert a["optimizer_fusion"]["in_effect"] == "torch.optim.AdamW(foreach=False)"
    assert a["checkpoint_segments"]["in_effect"] == [] and a["compile"]["in_effect"] == "off"


def test_fp16_on_cpu_records_why() -> None:
    h = harness.build(cfg(precision="fp16"))
    assert "no CUDA device" in h.applied["precision"]["why"]
    assert math.isfinite(h.step(next(h.batches())))


# --- gradient accumulation: the global batch's optimizer step, whatever the micro-batch ---------------


def test_accumulated_micro_batches_make_the_full_batch_step() -> None:
    full = harness.build(cfg(batch_size=8, global_batch=8))
    micro = harness.build(cfg(batch_size=2, global_batch=8))
    assert (full.cfg.grad_accum, micro.cfg.grad_accum) == (1, 4)
    groups = micro.batches()
    for _ in range(3):  # the same 8 samples per step: the data order does not depend on the micro-batch
        group = next(groups)
        assert len(group) == 4 and all(len(x) == 2 for x, _ in group)
        batch = [(torch.cat([x for x, _ in group]), torch.cat([y for _, y in group]))]
        assert math.isclose(full.step(batch), micro.step(group), rel_tol=1e-5)  # mean loss over the 8 samples
    for a, b in zip(params(full.model), params(micro.model)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # the same weights after three steps


def test_a_stub_accumulation_would_differ() -> None:
    # Guard for the test above: steps on 2 samples each do move the weights elsewhere.
    full = harness.build(cfg(batch_size=8, global_batch=8))
    small = harness.build(cfg(batch_size=2))
    group = next(harness.build(cfg(batch_size=2, global_batch=8)).batches())
    full.step([(torch.cat([x for x, _ in group]), torch.cat([y for _, y in group]))])
    for g in group:
        small.step([g])
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(params(full.model), params(small.model)))


def test_grouped_keeps_a_short_last_group() -> None:
    assert list(harness.grouped(iter(range(5)), 2)) == [[0, 1], [2, 3], [4]]


def test_lr_in_effect_is_scaled_for_another_global_batch() -> None:
    h = harness.build(cfg(batch_size=32, lr=1e-3))  # free global batch 32 vs the reference 8: sqrt(4) = 2
    assert h.optimizer.param_groups[0]["lr"] == pytest.approx(2e-3)
    assert h.applied["lr"]["in_effect"] == pytest.approx(2e-3) and "sqrt" in h.applied["lr"]["why"]
    fixed = harness.build(cfg(batch_size=4, global_batch=32, lr=1e-3))  # the study's global batch: lr as given
    assert fixed.optimizer.param_groups[0]["lr"] == 1e-3 and fixed.applied["grad_accum"]["in_effect"] == 8
