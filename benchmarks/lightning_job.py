"""A small Lightning job whose speed depends on the DataLoader: each item is a PNG decoded from bytes with
PIL, resized, cropped and flipped with numpy, so the main process spends real CPU time loading, and
`num_workers` / `persistent_workers` / `batch_size` move samples/s. The model is a small conv net.

    autotune search --pipeline lightning:benchmarks.lightning_job:make --budget 5m

`make(cfg)` is the factory autotune calls (with its TrialConfig; only `cfg.seed` is read). The
benchmark (benchmarks/lightning_export.py) builds the same objects itself, as a user would, through
`Classifier(lr=...)` and `Images(seed, dataloader_kwargs=...)`.

The datamodule's own train loader is the plain-PyTorch baseline autotune measures against (batch 8, no
worker processes), so the user's untuned run and the search's baseline are the same configuration.
"""

from __future__ import annotations

import io
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

N_ITEMS = 512  # one epoch: 64 steps at batch 8
UNIQUE = 64  # distinct PNGs encoded at setup (item i decodes PNG i % UNIQUE): cheap to build, as costly to read
STORED = 224  # px, the PNG as stored
CROP = 64  # px, what the model sees
CLASSES = 10
BATCH = 8  # the datamodule's own batch: the same as autotune's baseline


def _png(rng: np.random.Generator, label: int) -> bytes:
    """A noisy STORED x STORED RGB image whose stripes' period says its class; PNG-encoded, so reading it
    back is real decoding work (noise does not compress)."""
    y = np.arange(STORED, dtype=np.float32)[:, None]
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * y / (4 + 2 * label))
    img = 0.6 * stripes[..., None] + 0.4 * rng.random((STORED, STORED, 3), dtype=np.float32)
    buf = io.BytesIO()
    Image.fromarray((img * 255).astype(np.uint8)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


class PngImages(Dataset):
    """N_ITEMS items over UNIQUE encoded PNGs in memory; __getitem__ decodes one, resizes it, takes a random
    crop and flip (drawn from the item's own seed, so the loader's workers do not change what is learnt)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.labels = [int(x) for x in rng.integers(0, CLASSES, UNIQUE)]
        self.pngs = [_png(rng, label) for label in self.labels]
        self.seed = seed

    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.open(io.BytesIO(self.pngs[i % UNIQUE])).convert("RGB").resize((96, 96), Image.BILINEAR)
        a = np.asarray(img, dtype=np.float32) / 255.0
        rng = np.random.default_rng((self.seed, i))
        top, left = rng.integers(0, 96 - CROP + 1, 2)
        a = a[top : top + CROP, left : left + CROP]
        if rng.random() < 0.5:
            a = a[:, ::-1]
        a = (a - a.mean(axis=(0, 1))) / (a.std(axis=(0, 1)) + 1e-6)
        return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))), self.labels[i % UNIQUE]


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

        self.net = nn.Sequential(
            block(3, 16), block(16, 32), block(32, 64), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class Images(pl.LightningDataModule):
    """dataloader_kwargs: the train DataLoader's arguments in place of the datamodule's own (batch 8, no
    workers), as a user pastes the `dataloader_kwargs` that `autotune export --format lightning` writes."""

    def __init__(self, seed: int, dataloader_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.seed = seed
        self.dataloader_kwargs = {"batch_size": BATCH} | dict(dataloader_kwargs or {})

    def setup(self, stage: str) -> None:
        self.train = PngImages(self.seed)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train, shuffle=True, **self.dataloader_kwargs)


def make(cfg: Any) -> tuple[Classifier, Images]:  # --pipeline lightning:benchmarks.lightning_job:make
    return Classifier(), Images(cfg.seed)
