"""The ceiling measurement: each phase timed by a Clock of its own (its warm-up unseen, its window at least
its steps and seconds, the data wait inside each step), on a fake time so each figure is known exactly;
FlopCounterMode over one training step counts what the model computes, worked by hand; the section holds
each figure with how it was measured; a model with no countable op says so."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune.core.config import TrialConfig
from autotune.trial.probes import ceiling
from autotune.trial.loop.harness import build
from autotune.trial.measurement import clock as clock_module
from autotune.trial.measurement import measure
from tests.fault_pipelines import TinyPipeline
from tests.trial.measurement.test_clock import FakeTime

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


def fake_phase(monkeypatch: pytest.MonkeyPatch, wait: float, warm: float, timed: float) -> tuple[Any, Iterator[int]]:
    """A harness whose step takes `warm` s on the source's first 3 batches, then `timed` s, and a source that
    blocks `wait` s on each batch; the clock reads the fake time."""
    t = FakeTime()
    monkeypatch.setattr(clock_module, "time", t)
    monkeypatch.setattr(measure, "time", t)
    stepped: list[int] = []

    def step(batch: int) -> float:
        stepped.append(batch)
        t.advance(warm if batch < 3 else timed)
        return 1.0

    def source() -> Iterator[int]:
        n = 0
        while True:
            t.advance(wait)
            yield n
            n += 1

    h = types.SimpleNamespace(device=torch.device("cpu"), cfg=TINY.replace(batch_size=4), step=step, stepped=stepped)
    return h, source()


def test_a_phase_is_timed_by_its_clock_after_its_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    h, source = fake_phase(monkeypatch, wait=0.25, warm=20.0, timed=0.75)
    t = ceiling.timed_steps(h, source, min_steps=2, seconds=3.5, warmup=3)
    # 3 warm-up steps unseen, then 1 s steps (0.25 s of it blocked on the source) until 3.5 s have passed.
    assert h.stepped == list(range(3 + 4)) and t.steps == 4 and t.seconds == 4.0
    assert t.samples_per_s == 4 * 4 / 4.0 and t.data_wait == 0.25
    h, source = fake_phase(monkeypatch, wait=0.0, warm=1.0, timed=1.0)
    t = ceiling.timed_steps(h, source, min_steps=3, seconds=0.1)  # no warm-up: benchmarks/roofline.py's call
    assert t.steps == 3 and t.seconds == 3.0  # the seconds were spent after one step, the steps were not


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
