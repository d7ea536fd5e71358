"""The seed's pipeline: smp Unet-resnet34, binary person segmentation, images decoded from disk."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

from autotune.core.errors import ConfigError

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

# torchvision 0.29 (pinned) deprecates its decoders in favour of TorchCodec; they still work, and
# one warning per decoded image would drown the trial log.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class SegmentationFolder(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Decode + random-resized-crop + flip inside __getitem__, so DataLoader workers do real work."""

    def __init__(self, pairs: list[tuple[Path, Path]], size: int, train: bool = True) -> None:
        self.pairs = pairs
        self.transform = (v2.Compose([v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True),
                                      v2.RandomHorizontalFlip()])
                          if train else v2.Resize((size, size), antialias=True))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image_path, mask_path = self.pairs[i]
        image = tv_tensors.Image(decode_image(str(image_path), mode=ImageReadMode.RGB))
        mask = tv_tensors.Mask(decode_image(str(mask_path), mode=ImageReadMode.GRAY))
        image, mask = self.transform(image, mask)  # one crop for both: masks use nearest
        x = (image.as_subclass(torch.Tensor).float() / 255 - MEAN) / STD
        y = (mask.as_subclass(torch.Tensor) > 127).float()
        return x, y


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

    # checkpoint_segments wraps the first k of these, in forward order.
    stages = ("encoder.conv1", "encoder.layer1", "encoder.layer2", "encoder.layer3", "encoder.layer4",
              "decoder.blocks.0", "decoder.blocks.1", "decoder.blocks.2", "decoder.blocks.3", "decoder.blocks.4")
    unsupported: frozenset[str] = frozenset()

    def __init__(self, cfg: TrialConfig) -> None:
        from autotune.pipelines.unet.data import scan_folder

        if not cfg.data_dir:
            raise ConfigError("the unet pipeline needs data_dir (generate one with `autotune make-data DIR`)")
        self.image_size = cfg.image_size
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

    def build_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return SegmentationFolder(self.train_pairs, self.image_size, train=True)

    def build_val_dataset(self) -> Dataset[tuple[torch.Tensor, torch.Tensor]]:
        return SegmentationFolder(self.val_pairs, self.image_size, train=False)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._loss(output, target)

    def metric(self, output: torch.Tensor, target: torch.Tensor) -> float:
        """Intersection over union of the thresholded prediction."""
        pred = output.float() > 0
        truth = target > 0.5
        inter = (pred & truth).sum().item()
        union = (pred | truth).sum().item()
        return inter / union if union else 1.0
