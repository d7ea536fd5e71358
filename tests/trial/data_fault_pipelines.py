"""A user's pipeline whose dataset cannot load one item (like a corrupt record in their own format).

Named as `tests.trial.data_fault_pipelines:make` in TrialConfig.pipeline. Four items, so a batch of
two over a shuffled epoch reaches the bad one within the first two steps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

BAD_INDEX = 3


class FlakyItems(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int = 4) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == BAD_INDEX:
            raise ValueError(f"record {i} is corrupt: unexpected end of stream")
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 16, 16, generator=g), (torch.rand(1, 16, 16, generator=g) > 0.5).float()


class FlakyPipeline:
    def __init__(self, cfg: Any, n: int = 4) -> None:
        self.cfg, self.n = cfg, n

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 1, 1))

    def build_dataset(self) -> Dataset[Any]:
        return FlakyItems(self.n)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(output.float(), target)


def make(cfg: Any) -> FlakyPipeline:
    return FlakyPipeline(cfg)


def make_large(cfg: Any) -> FlakyPipeline:
    """Enough items for any batch size a search tries (up to 64), the bad one among them."""
    return FlakyPipeline(cfg, n=64)
