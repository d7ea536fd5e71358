"""A user's training script with no autotune line at all, for scripts/gpu_check.sh's script-unedited2 row (and
its CPU test, tests/test_gpu_check.py): no process group, no DDP, no DistributedSampler, its loss computed
outside the model. Everything the row asserts is applied through autotune's no-edit seams: autocast around the
model's forward, channels_last weights, checkpointing of its repeated blocks, and on 2 ranks the process group,
the model's replicate and its DataLoader's DistributedSampler. `python unedited_script.py` trains as written.

Its data is made in memory (no folder to read): 32x32 noise images, the target a blurred threshold of them.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    """`n` images, each made from its own index (the same in any worker process)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(3, self.size, self.size, generator=torch.Generator().manual_seed(i))
        y = (nn.functional.avg_pool2d(x.mean(0, keepdim=True), 5, stride=1, padding=2) > 0).float()
        return x, y


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.norm1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.norm2 = nn.BatchNorm2d(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(x + self.norm2(self.conv2(y)))


class Net(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    loader = DataLoader(Noise(512, args.size), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = Net(args.width, args.depth).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = nn.BCEWithLogitsLoss()
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
