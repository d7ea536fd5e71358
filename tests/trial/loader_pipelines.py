"""A tiny pipeline whose loader shows how far ahead it made batches (tests/trial/loop/test_worker.py).

Named as `tests.trial.loader_pipelines:made_ahead`. Its dataset leaves one file per item it makes (in
the loader's worker processes) in the folder MADE_ENV names. Its model's first forward, the warm-up
step, waits as a slow first step does on a GPU (cuDNN autotuning, compilation) until the loader has made
every batch it can make ahead, then writes how many items were made by then to `<folder>/by_first_step`.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tests.fault_pipelines import TinyPipeline

MADE_ENV = "AUTOTUNE_TEST_MADE_DIR"
WAIT_S = 60.0  # the loader makes a few tiny batches in well under a second; this bounds a broken test


class _Stamped(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], folder: Path) -> None:
        self.inner, self.folder, self.made = inner, folder, itertools.count()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        (self.folder / f"{os.getpid()}-{next(self.made)}").touch()  # each worker process counts its own
        return self.inner[i]


class _SlowFirstStep(nn.Module):
    def __init__(self, inner: nn.Module, folder: Path, items: int) -> None:
        super().__init__()
        self.inner, self.folder, self.items, self.calls = inner, folder, items, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calls == 0:
            deadline = time.monotonic() + WAIT_S
            while len(os.listdir(self.folder)) < self.items and time.monotonic() < deadline:
                time.sleep(0.01)
            (self.folder.parent / "by_first_step").write_text(str(len(os.listdir(self.folder))))
        self.calls += 1
        return self.inner(x)


class MadeAheadPipeline(TinyPipeline):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.folder = Path(os.environ[MADE_ENV]) / "made"
        self.folder.mkdir(parents=True, exist_ok=True)

    def build_model(self) -> nn.Module:
        # The first step's batch, and every batch the loader keeps in flight: num_workers x prefetch_factor.
        ahead = self.cfg.num_workers * (self.cfg.prefetch_factor or 2) if self.cfg.num_workers else 0
        return _SlowFirstStep(super().build_model(), self.folder, (1 + ahead) * self.cfg.batch_size)

    def build_dataset(self) -> Dataset[Any]:
        return _Stamped(super().build_dataset(), self.folder)


def made_ahead(cfg: Any) -> MadeAheadPipeline:
    return MadeAheadPipeline(cfg)
