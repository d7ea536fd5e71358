"""Tiny Lightning jobs for the tests: a LightningModule and a LightningDataModule that learn a toy task in
a few steps, and factories that return the wrong things (`--pipeline lightning:tests.pipelines.lightning_jobs:...`)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class Toy(pl.LightningDataModule):
    """512 random points; the target is which of the first four coordinates is largest."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def setup(self, stage: str) -> None:
        x = torch.randn(512, 16, generator=torch.Generator().manual_seed(self.seed))
        self.train = TensorDataset(x, x[:, :4].argmax(dim=1))

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train, batch_size=32, shuffle=True)


def make(cfg: Any) -> tuple[Classifier, Toy]:
    return Classifier(), Toy(cfg.seed)


def swapped(cfg: Any) -> tuple[Toy, Classifier]:
    """The two objects the wrong way round."""
    return Toy(cfg.seed), Classifier()


def module_only(cfg: Any) -> Classifier:
    return Classifier()
