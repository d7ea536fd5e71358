"""A plain PyTorch training script, tuned by autotune as written: its own argparse, DataLoader over image
files on disk (`autotune make-data DIR` writes DIR/images/*.jpg and DIR/masks/*.png), SGD with momentum,
a step lr schedule and gradient clipping. The lines marked `# at` are the only ones autotune needs;
outside a trial each is the identity, so `python plain_script.py DATA` trains as before.

    autotune search --script plain_script.py --script-args "DATA --epochs 100" --budget 10m
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from autotune import script as at  # at


class Masks(Dataset):
    """(image, mask) pairs matched by file stem, resized to `size` pixels square."""

    def __init__(self, root: str, size: int) -> None:
        self.images = sorted(p for p in (Path(root) / "images").iterdir() if p.suffix in (".jpg", ".png"))
        self.masks = Path(root) / "masks"
        self.size = size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = Image.open(self.images[i]).convert("RGB").resize((self.size, self.size))
        mask = Image.open(self.masks / f"{self.images[i].stem}.png").convert("L").resize((self.size, self.size))
        x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)
        y = torch.from_numpy((np.asarray(mask) > 127).astype(np.float32))[None]
        return x, y


def net(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 1, 1),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data", help="folder with images/ and masks/")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(at.seed(0))  # at
    loader = DataLoader(Masks(args.data, args.size), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, drop_last=True)  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = at.model(net(args.width).to(device))  # at
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    criterion = nn.BCEWithLogitsLoss()
    scaler = at.scaler()  # at
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with at.autocast():  # at
                loss = criterion(model(x).float(), y)
            scaler.scale(loss).backward()  # at: was loss.backward()
            scaler.unscale_(optimizer)  # at
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)  # at: was optimizer.step()
            scaler.update()  # at
            total += loss.item()
        schedule.step()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}", flush=True)


if __name__ == "__main__":
    main()
