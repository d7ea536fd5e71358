"""Pipelines for the parity check (tests/search/checks/test_parity.py, benchmarks/parity.py), named as
`tests.parity_pipelines:<factory>` in TrialConfig.pipeline.

Both learn one rule, fast: a pixel is foreground where its first channel exceeds its second, from
3x16x16 random images, through a two-layer conv net without batch norm (so 4 x 2 accumulated
micro-batches compute batch 8's step, up to rounding). Each conv's output is multiplied by GAIN and
its initial weights divided by it: the same net at initialisation, but Adam (whose step is lr,
whatever the gradient's scale) moves it GAIN times faster, so that 30 steps at the default lr 1e-3
take the loss from ~0.69 to ~0.41 and a stall stands out.

healthy: the net as it should be.
fast_in_bf16: the healthy net, whose fp32 steps each wait SLOW_FP32_S more (a step bound by fp32 work): under
         bf16 autocast the same net trains as `healthy` does, and many times faster by construction.
offset:  the same net with a numerically naive step between its layers, h -> (h + OFFSET) - OFFSET,
         like a running total taken relative to a large base. In fp32 it is the identity up to
         OFFSET x 2^-24 (~2.4e-4), and the net trains as `healthy` does (the same losses to 3 decimals
         over 30 steps). Under bf16 autocast the conv's output is bf16 (8 significant bits: the spacing
         at 4096 is 32), so every activation smaller than 16 in magnitude comes back as exactly 0. The second layer then sees zeros: its
         weights get no gradient, nor (through ReLU's zero slope at 0) does the first layer's; only
         the last bias moves. The loss stays finite - no NaN, no inf, nothing a numerics guard can
         see - but the net stops learning: the failure the parity check exists to catch.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

OFFSET = 4096.0
GAIN = 10.0
SLOW_FP32_S = 0.1


class Gain(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * GAIN


def _conv(c_in: int, c_out: int, k: int) -> nn.Conv2d:
    conv = nn.Conv2d(c_in, c_out, k, padding=k // 2)
    with torch.no_grad():  # the same function at initialisation as the plain conv
        conv.weight /= GAIN
        conv.bias /= GAIN  # type: ignore[operator]
    return conv


class Offset(nn.Module):
    """(h + OFFSET) - OFFSET: the identity in exact arithmetic; rounds h away in bf16."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h + OFFSET) - OFFSET


class RulePipeline:
    stages = ("0", "4")
    unsupported: frozenset[str] = frozenset()
    offset = False

    def __init__(self, cfg: Any, n: int = 256) -> None:
        self.cfg = cfg
        self.n = n

    def build_model(self) -> nn.Module:
        middle: nn.Module = Offset() if self.offset else nn.Identity()
        return nn.Sequential(_conv(3, 8, 3), Gain(), middle, nn.ReLU(), _conv(8, 1, 1), Gain())

    def build_dataset(self) -> Dataset[Any]:
        g = torch.Generator().manual_seed(0)  # the same data in every process, whatever cfg.seed
        x = torch.randn(self.n, 3, 16, 16, generator=g)
        y = (x[:, :1] > x[:, 1:2]).float()
        return TensorDataset(x, y)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(output.float(), target)


class SlowInFp32(nn.Module):
    """Waits SLOW_FP32_S outside autocast: fast_in_bf16's built-in speedup, whatever this CPU's bf16."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda"):
            time.sleep(SLOW_FP32_S)
        return h


class FastInBf16(RulePipeline):
    def build_model(self) -> nn.Module:
        return nn.Sequential(*super().build_model(), SlowInFp32())  # the same layers and weights as healthy


class OffsetPipeline(RulePipeline):
    offset = True


class CrashesInBf16(RulePipeline):
    """Fails (an ordinary exception, so the trial ends as a crash) when autocast is on."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if output.dtype == torch.bfloat16:
            raise RuntimeError("this model does not run in bf16 (a test's deliberate crash)")
        return super().loss(output, target)


def healthy(cfg: Any) -> RulePipeline:
    return RulePipeline(cfg)


def fast_in_bf16(cfg: Any) -> FastInBf16:
    return FastInBf16(cfg)


def offset(cfg: Any) -> OffsetPipeline:
    return OffsetPipeline(cfg)


def crashes_in_bf16(cfg: Any) -> CrashesInBf16:
    return CrashesInBf16(cfg)
