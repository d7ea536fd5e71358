"""Pipelines for `autotune train`'s tests: the shapes of the real ones (a held-out set, a metric, blocks to
shard) on data small enough that an epoch takes a few steps, so a test spends its time in train's mechanics.

Named as `tests.apply.train_pipelines:<factory>` in TrialConfig.pipeline.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from autotune.pipelines.examples.language_model import LanguageModelPipeline, TokenDataset, markov_tokens
from tests.fault_pipelines import TinyPipeline

TRAIN_SAMPLES = 22  # a partial last batch at batch 4 and at batch 8


class ValidatedTiny(TinyPipeline):
    """fault_pipelines' two-conv net, with 2 held-out samples and the Unet's metric (IoU)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, n=TRAIN_SAMPLES)

    def build_val_dataset(self) -> Dataset[Any]:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 3, 16, 16, generator=g)
        return TensorDataset(x, (torch.rand(2, 1, 16, 16, generator=g) > 0.5).float())

    def metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        pred, truth = output.float() > 0, target > 0.5
        union = int((pred | truth).sum())
        return int((pred & truth).sum()) / union if union else 1.0


def validated_tiny(cfg: Any) -> ValidatedTiny:
    return ValidatedTiny(cfg)


class SmallLanguageModel(LanguageModelPipeline):
    """make_w64_d2's model (64 wide, 2 blocks) on 256 training and 64 validation sequences, not 4096 and 512."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, width=64, depth=2)

    def build_dataset(self) -> Dataset[Any]:
        return TokenDataset(markov_tokens(256, self.seq_len + 1, self.seed))

    def build_val_dataset(self) -> Dataset[Any]:
        return TokenDataset(markov_tokens(64, self.seq_len + 1, self.seed + 1))


def small_language_model(cfg: Any) -> SmallLanguageModel:
    return SmallLanguageModel(cfg)
