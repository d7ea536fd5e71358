"""Example pipeline: a torchvision ResNet-18 image classifier on an ImageFolder-style set of JPEGs.

    autotune search --pipeline autotune.pipelines.examples.classifier:make [--data DIR] [--image-size 128]

Data layout: DIR/<class name>/*.{jpg,jpeg,png}, one folder per class (torchvision's ImageFolder).
Without --data, a synthetic set (coloured shapes and stripes on noisy backgrounds, 160x120 JPEGs,
deterministic per seed) is written once under studies/data/classifier-synthetic, relative to the
working directory, and reused by every later trial and run.

Images are decoded and augmented (RandomResizedCrop to image_size, horizontal flip) inside
__getitem__, so DataLoader workers do real work and num_workers matters, as in a real job.
"""

from __future__ import annotations

import colorsys
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset
from torchvision.transforms import v2

from autotune.core.errors import DataError

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

DEFAULT_DIR = Path("studies") / "data" / "classifier-synthetic"
SYNTHETIC_N = 640  # enough for one global batch of 64 on 8 GPUs after the validation hold-out
SYNTHETIC_SIZE = (160, 120)
SUFFIXES = (".jpg", ".jpeg", ".png")
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

# Each class has its own shape and hue, so the label is learnable from any reasonable crop.
CLASSES = (("red_circles", 0.0), ("green_squares", 0.33), ("blue_triangles", 0.62), ("yellow_stripes", 0.15))


# ------------------------------------------------------------------------------------ synthetic data


def _rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
    return int(r * 255), int(g * 255), int(b * 255)


def synthetic_image(label: int, rng: np.random.Generator, size: tuple[int, int] = SYNTHETIC_SIZE) -> Image.Image:
    """One image of class `label`: several instances of its shape, in its hue, on a muted background."""
    w, h = size
    base = np.array(_rgb(rng.random(), rng.uniform(0, 0.3), rng.uniform(0.3, 0.8)), dtype=np.float32)
    ramp = np.linspace(-1, 1, w, dtype=np.float32)[None, :, None] * rng.uniform(-40, 40)
    noise = rng.normal(0, 12, size=(h, w, 3)).astype(np.float32)
    image = Image.fromarray(np.clip(base + ramp + noise, 0, 255).astype(np.uint8), mode="RGB")
    draw = ImageDraw.Draw(image)
    hue = CLASSES[label][1]

    def colour() -> tuple[int, int, int]:
        return _rgb(hue + rng.uniform(-0.03, 0.03), rng.uniform(0.65, 1.0), rng.uniform(0.65, 1.0))

    if CLASSES[label][0] == "yellow_stripes":
        period, width = int(rng.integers(10, 20)), int(rng.integers(3, 7))
        offset = int(rng.integers(0, period))
        for x in range(-h + offset, w, period):  # diagonal stripes over the whole image
            draw.line((x, 0, x + h, h), fill=colour(), width=width)
        return image
    for _ in range(int(rng.integers(3, 7))):
        r = rng.uniform(0.08, 0.2) * h
        cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        if CLASSES[label][0] == "red_circles":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour())
        elif CLASSES[label][0] == "green_squares":
            draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour())
        else:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour())
    return image


def make_synthetic(out: str | os.PathLike[str], n: int = SYNTHETIC_N, seed: int = 0) -> Path:
    """Write n images (balanced over CLASSES) to out/<class>/NNNNN.jpg. Atomic: the folder appears whole."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, _ in CLASSES:
            (tmp / name).mkdir()
        for i in range(n):
            label = i % len(CLASSES)
            # One generator per image: the set is the same whatever order or process writes it.
            image = synthetic_image(label, np.random.default_rng([seed, i]))
            image.save(tmp / CLASSES[label][0] / f"{i:05d}.jpg", quality=90)
        (tmp / "README.txt").write_text(
            f"autotune synthetic classification set\nn: {n}\nsize: "
            f"{SYNTHETIC_SIZE[0]}x{SYNTHETIC_SIZE[1]}\nseed: {seed}\n"
            "classes: " + ", ".join(c for c, _ in CLASSES) + "\n"
        )
        try:
            os.replace(tmp, out)  # replaces a missing or empty folder atomically; fails if one is there
        except OSError:
            if not _complete(out):
                raise DataError(f"could not move the synthetic set into {out}") from None
            shutil.rmtree(tmp, ignore_errors=True)  # another process (a concurrent trial) won the race
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _complete(folder: Path) -> bool:
    return (folder / "README.txt").is_file()


def ensure_synthetic(out: str | os.PathLike[str] = DEFAULT_DIR, seed: int = 0) -> Path:
    """The synthetic set under `out`, generated on first use and reused afterwards."""
    out = Path(out).resolve()
    return out if _complete(out) else make_synthetic(out, seed=seed)


def scan_image_folder(root: str | os.PathLike[str]) -> tuple[list[str], list[tuple[Path, int]]]:
    """(class names, [(image path, label)]) for root/<class>/*.{jpg,jpeg,png}, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if classes == ["images", "masks"]:  # would "work" as two classes, and train on nonsense
        raise DataError(
            f"data folder {root} is a segmentation set (images/ + masks/); the classifier "
            "needs one subfolder per class, e.g. DIR/cat/*.jpg"
        )
    if len(classes) < 2:
        raise DataError(
            f"data folder {root} needs one subfolder per class (at least 2), e.g. {root}/cat/*.jpg; "
            f"found {len(classes)}"
        )
    samples = [
        (p, label)
        for label, c in enumerate(classes)
        for p in sorted((root / c).iterdir())
        if p.suffix.lower() in SUFFIXES and p.is_file() and not p.name.startswith(".")
    ]
    if not samples:
        raise DataError(f"data folder {root} has no images in its class folders (*.jpg, *.jpeg, *.png)")
    return classes, samples


# -------------------------------------------------------------------------------------- the pipeline


class ImageFolderDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Decode + augment in __getitem__: the work num_workers spreads over processes."""

    def __init__(self, samples: list[tuple[Path, int]], size: int, train: bool = True) -> None:
        self.samples = samples
        self.transform = (
            v2.Compose([v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip()])
            if train
            else v2.Compose([v2.Resize(size, antialias=True), v2.CenterCrop(size)])
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        path, label = self.samples[i]
        with Image.open(path) as im:  # PIL, not torchvision.io: its decoders are deprecated since 0.29
            image = self.transform(v2.functional.pil_to_tensor(im.convert("RGB")))
        x = (image.float() / 255 - MEAN) / STD
        return x, torch.tensor(label, dtype=torch.long)


class ClassifierPipeline:
    """torchvision resnet18(num_classes=K), no pretrained weights (nothing is downloaded)."""

    # activation checkpointing wraps the first k of these, in forward order.
    stages = ("conv1", "layer1", "layer2", "layer3", "layer4")
    unsupported: frozenset[str] = frozenset()

    def __init__(self, cfg: TrialConfig) -> None:
        root = Path(cfg.data_dir) if cfg.data_dir else ensure_synthetic(DEFAULT_DIR)
        self.classes, samples = scan_image_folder(root)
        self.image_size = cfg.image_size
        # Every tenth image is held out for `autotune train` validation; trials train on the rest.
        self.val_samples = samples[::10] if len(samples) >= 10 else []
        self.train_samples = [s for i, s in enumerate(samples) if i % 10 or len(samples) < 10]

    def build_model(self) -> nn.Module:
        from torchvision.models import resnet18

        return resnet18(weights=None, num_classes=len(self.classes))

    def build_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return ImageFolderDataset(self.train_samples, self.image_size, train=True)

    def build_val_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return ImageFolderDataset(self.val_samples, self.image_size, train=False)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.float(), target)  # fp32 loss even under autocast

    def metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        """Top-1 accuracy."""
        return (output.argmax(dim=1) == target).float().mean().item()


def make(cfg: TrialConfig) -> ClassifierPipeline:
    return ClassifierPipeline(cfg)
