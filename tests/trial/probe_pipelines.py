"""A pipeline whose saved activations can be counted by hand, for tests/trial/probes/test_model_facts.py.

Linear(8, 16) -> ReLU -> Linear(16, 4), MSE loss. Autograd saves per sample: the input (8 floats, for
the first weight's grad), the ReLU's output (16, kept once though the ReLU and the second Linear both
save it), the output and the target (4 + 4, for the loss): 32 floats, 128 bytes. The weights it saves
(transposed views) are parameters, counted as such.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

SAVED_PER_SAMPLE = (8 + 16 + 4 + 4) * 4
PARAMS = 8 * 16 + 16 + 16 * 4 + 4


class MlpPipeline:
    stages = ("0", "2")  # the first Linear (its input inside it) and the second (its input seen before)

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def build_dataset(self) -> TensorDataset:
        g = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g))

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)


def mlp(cfg: Any) -> MlpPipeline:
    return MlpPipeline(cfg)
