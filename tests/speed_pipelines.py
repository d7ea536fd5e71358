"""Pipelines whose configs differ in speed by construction, so a test of what is exported asserts the
path it names on every run, whatever the noise of tiny CPU trials.

loader_bound: fault_pipelines' tiny net over a dataset whose every item waits ITEM_S (a decode from a
slow disk, without using a CPU). The loader is the bottleneck: with num_workers=0 a step waits for its
batch's items one after another; with 2 workers they wait side by side, so a step takes about half as
long (~x2 samples/s), and on a busy 2-core machine too, since the wait holds no core.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import Dataset

from tests.fault_pipelines import TinyPipeline

ITEM_S = 0.025


class SlowItems(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(ITEM_S)
        return self.inner[i]


class LoaderBoundPipeline(TinyPipeline):
    def build_dataset(self) -> Dataset[Any]:
        return SlowItems(super().build_dataset())


def loader_bound(cfg: Any) -> LoaderBoundPipeline:
    return LoaderBoundPipeline(cfg)
