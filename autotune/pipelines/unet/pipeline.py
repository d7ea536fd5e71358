"""The seed's pipeline: smp Unet-resnet34, binary person segmentation, images decoded from disk."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from autotune.core.errors import ConfigError, DataItemError
from autotune.pipelines import SKIP_BAD_DATA_ENV
from autotune.pipelines.unet.data import decode_reason, scan_folder, screen_pairs, validate_folder

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

# torchvision 0.29 (pinned) deprecates its decoders in favour of TorchCodec; they still work, and
# one warning per decoded image would drown the trial log.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class BadPairFile(Exception):
    """One file of a pair that training cannot use, and why (a short reason, no path in it)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def decode_pair(image_path: Path, mask_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Both files of a pair, decoded as training uses them (the up-front check calls this too, so
    what it passes is what trials can read); BadPairFile naming the file otherwise."""
    decoded = []
    for path, mode in ((image_path, ImageReadMode.RGB), (mask_path, ImageReadMode.GRAY)):
        try:
            decoded.append(decode_image(str(path), mode=mode))
        except Exception as e:  # RuntimeError from the codecs, OSError from the read
            if isinstance(e, MemoryError):
                raise
            raise BadPairFile(Path(path), decode_reason(e)) from None
    image, mask = decoded
    if image.shape[-2:] != mask.shape[-2:]:
        (ih, iw), (mh, mw) = image.shape[-2:], mask.shape[-2:]
        raise BadPairFile(Path(image_path), f"image is {iw}x{ih} but its mask is {mw}x{mh}")
    return image, mask


class SegmentationFolder(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Decode + random-resized-crop + flip inside __getitem__, so DataLoader workers do real work.
    A file that cannot be used raises DataItemError naming it relative to `root`."""

    def __init__(
        self, pairs: list[tuple[Path, Path]], size: int, train: bool = True, root: str | os.PathLike[str] | None = None
    ) -> None:
        self.pairs = pairs
        self.root = Path(root) if root is not None else None
        self.transform = (
            v2.Compose([v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True), v2.RandomHorizontalFlip()])
            if train
            else v2.Resize((size, size), antialias=True)
        )

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            decoded = decode_pair(*self.pairs[i])
        except BadPairFile as e:
            name = _relative(e.path, self.root)
            raise DataItemError(
                f"cannot load {name} in data folder {self.root or e.path.parent} ({e.reason}); fix or remove it",
                path=name,
                index=i,
            ) from None
        image, mask = tv_tensors.Image(decoded[0]), tv_tensors.Mask(decoded[1])
        image, mask = self.transform(image, mask)  # one crop for both: masks use nearest
        x = (image.as_subclass(torch.Tensor).float() / 255 - MEAN) / STD
        y = (mask.as_subclass(torch.Tensor) > 127).float()
        return x, y


def _relative(path: Path, root: Path | None) -> str:
    try:
        return str(path.relative_to(root)) if root is not None else str(path)
    except ValueError:
        return str(path)


class BceDiceLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import segmentation_models_pytorch as smp

        self.bce = nn.BCEWithLogitsLoss()
        self.dice = smp.losses.DiceLoss(mode="binary", from_logits=True)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.float()  # the loss in fp32 even under autocast: it is cheap and stable
        return self.bce(logits, target) + self.dice(logits, target)


class UnetPipeline:
    """smp.Unet('resnet34', encoder_weights=None). AUTOTUNE_ENCODER_WEIGHTS may name a local state_dict."""

    # activation checkpointing wraps the first k of these, in forward order.
    stages = (
        "encoder.conv1",
        "encoder.layer1",
        "encoder.layer2",
        "encoder.layer3",
        "encoder.layer4",
        "decoder.blocks.0",
        "decoder.blocks.1",
        "decoder.blocks.2",
        "decoder.blocks.3",
        "decoder.blocks.4",
    )
    unsupported: frozenset[str] = frozenset()

    def __init__(self, cfg: TrialConfig) -> None:
        if not cfg.data_dir:
            raise ConfigError("the unet pipeline needs data_dir (generate one with `autotune make-data DIR`)")
        self.image_size = cfg.image_size
        self.data_dir = cfg.data_dir
        self.pairs = scan_folder(cfg.data_dir)
        self._loss = BceDiceLoss()
        # Hold out a tenth for `autotune train` validation; trials train on the rest.
        n_val = max(1, len(self.pairs) // 10) if len(self.pairs) >= 10 else 0
        self.train_pairs, self.val_pairs = self.pairs[n_val:], self.pairs[:n_val]

    def build_model(self) -> nn.Module:
        import segmentation_models_pytorch as smp

        model = smp.Unet("resnet34", encoder_weights=None, classes=1)
        weights = os.environ.get("AUTOTUNE_ENCODER_WEIGHTS")
        if weights:
            model.encoder.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=False)
        return model

    def model_key(self) -> tuple[()] | None:
        """The same model for every config: nothing of it reaches build_model, so a warm server may draw
        it once (autotune.trial.loop.warm_model). None when AUTOTUNE_ENCODER_WEIGHTS names a file to load."""
        return None if os.environ.get("AUTOTUNE_ENCODER_WEIGHTS") else ()

    def build_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return SegmentationFolder(self._usable(self.train_pairs), self.image_size, train=True, root=self.data_dir)

    def build_val_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return SegmentationFolder(self._usable(self.val_pairs), self.image_size, train=False, root=self.data_dir)

    def validate_data(self, *, skip_bad: bool, progress: Callable[[int, int], None] | None) -> str | None:
        """Decode every pair once (see validate_folder); with skip_bad, a note on what was dropped."""
        good = set(validate_folder(self.data_dir, skip_bad=skip_bad, progress=progress))
        if len(good) == len(self.pairs):
            return None
        # The split stays as it was, so a trial (which screens its own pairs) trains on the same ones.
        self.train_pairs = [p for p in self.train_pairs if p in good]
        self.val_pairs = [p for p in self.val_pairs if p in good]
        return f"data: dropped {len(self.pairs) - len(good)} undecodable image/mask pairs of {len(self.pairs)}"

    def _usable(self, pairs: list[tuple[Path, Path]]) -> list[tuple[Path, Path]]:
        """All pairs; under --skip-bad-data (which the controller passes to trials in the
        environment) those failing a cheap header check, as the up-front validation dropped them."""
        if os.environ.get(SKIP_BAD_DATA_ENV, "") in ("", "0"):
            return pairs
        good, bad = screen_pairs(pairs)
        if bad:
            print(
                f"autotune: {SKIP_BAD_DATA_ENV}: skipping {len(bad)} of {len(pairs)} image/mask pairs with a bad "
                f"file (first: {_relative(bad[0][0], Path(self.data_dir))}: {bad[0][1]})",
                file=sys.stderr,
            )
        return good

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._loss(output, target)

    def metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        """Intersection over union of the thresholded prediction."""
        pred = output.float() > 0
        truth = target > 0.5
        inter = (pred & truth).sum().item()
        union = (pred | truth).sum().item()
        return inter / union if union else 1.0
