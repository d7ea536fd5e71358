"""The ceiling measurement: FlopCounterMode over one training step counts what the model computes, worked
by hand; the section holds each figure with how it was measured; a model with no countable op says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune.core.config import TrialConfig
from autotune.trial.probes import ceiling
from autotune.trial.loop.harness import build
from tests.fault_pipelines import TinyPipeline

TINY = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=64, batch_size=4)
ELEMENTWISE = TINY.replace(pipeline="tests.trial.probes.test_ceiling:elementwise")


class ElementwisePipeline(TinyPipeline):
    """A learnable per-channel scale and shift: no matmul, conv or attention for FlopCounterMode to count."""

    def build_model(self) -> nn.Module:
        class Affine(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.scale = nn.Parameter(torch.ones(1, 3, 1, 1))
                self.shift = nn.Parameter(torch.zeros(1, 3, 1, 1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return (x * self.scale + self.shift).mean(dim=1, keepdim=True)

        return Affine()


def elementwise(cfg: Any) -> ElementwisePipeline:
    return ElementwisePipeline(cfg)


def conv_flops(n: int, c_in: int, c_out: int, k: int, hw: int) -> int:
    """2 x multiply-adds of a stride-1, same-padded convolution (FlopCounterMode's convention, no bias)."""
    return 2 * n * c_out * hw * c_in * k * k


def test_the_flops_of_one_step_of_a_tiny_conv_net_are_the_analytic_count(repo_on_path: Path) -> None:
    h = build(TINY, endless=True)
    batch = next(h.batches())
    n, hw = TINY.batch_size, 16 * 16  # the tiny pipeline's images are 16 x 16 whatever the crop size
    first, second = conv_flops(n, 3, 8, 3, hw), conv_flops(n, 8, 1, 1, hw)
    # Forward: both convs. Backward: each weight's gradient (a conv's own cost), and the input gradient
    # of the second only: the first conv's input is the data, which needs none.
    expected = (first + second) + (first + second) + second
    flops, why = ceiling.step_flops(h, batch)
    assert why is None and flops == expected


def test_the_peak_probe_says_its_size_dtype_and_repeats() -> None:
    peak = ceiling.peak_probe(torch.device("cpu"), torch.float32)
    n = peak["size"]
    assert peak["flops_per_s"] > 0 and n >= 256 and peak["repeats"] >= 1
    assert f"{n}x{n} float32 torch.mm on cpu" in peak["method"]


def test_the_section_has_each_figure_with_how_it_was_measured(
    repo_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceiling, "PHASE_S", 0.1)
    s = ceiling.measure_ceiling(TINY)
    assert s["compute_only_samples_per_s"] > 0 and s["end_to_end_samples_per_s"] > 0
    assert s["data_bound_ratio"] == pytest.approx(s["end_to_end_samples_per_s"] / s["compute_only_samples_per_s"])
    assert s["lost_to_data_wait"] == pytest.approx(max(0.0, 1 - s["data_bound_ratio"]))
    assert "cached batches" in s["ceiling_method"] and "batch 4 x 1" in s["ceiling_method"]
    assert s["peak_dtype"] == "float32" and s["probe_size"] >= 256 and "torch.mm" in s["peak_method"]
    assert "FlopCounterMode" in s["flops_method"]
    assert s["flops_per_sample"] > 0
    assert s["utilisation"] == pytest.approx(
        s["flops_per_sample"] * s["end_to_end_samples_per_s"] / s["peak_flops_per_s"]
    )
    assert s["utilisation_compute_only"] == pytest.approx(
        s["flops_per_sample"] * s["compute_only_samples_per_s"] / s["peak_flops_per_s"]
    )


def test_a_model_without_countable_flops_has_a_ceiling_and_says_why_it_has_no_utilisation(
    repo_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceiling, "PHASE_S", 0.1)
    s = ceiling.measure_ceiling(ELEMENTWISE)
    assert s["compute_only_samples_per_s"] > 0  # the data-bound ceiling needs no FLOP count
    assert s["utilisation"] is None and "peak_flops_per_s" not in s
    assert "counted no FLOPs" in s["utilisation_not_counted"]


def test_a_failed_measurement_is_a_reason_not_a_crash(tmp_path: Path, repo_on_path: Path) -> None:
    broken = TINY.replace(pipeline="tests.fault_pipelines:broken")
    s = ceiling.run_ceiling(broken, tmp_path, timeout_s=60)
    assert s["skipped"].startswith("the measurement failed (exited with code 1")
