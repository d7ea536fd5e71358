"""A script with no DataLoader: token batches from a memmap through its own get_batch, GradScaler,
gradient accumulation; autotune's loader knobs cannot reach it."""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from autotune import script as at

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--accum", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(at.seed(0))
path = Path(tempfile.mkdtemp()) / "tokens.bin"
np.random.default_rng(0).integers(0, 64, 4096, dtype=np.uint16).tofile(path)
data = np.memmap(path, dtype=np.uint16, mode="r")


def get_batch(n: int = 8, ctx: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.randint(len(data) - ctx - 1, (n,))
    x = torch.stack([torch.from_numpy(data[j : j + ctx].astype(np.int64)) for j in i])
    y = torch.stack([torch.from_numpy(data[j + 1 : j + 1 + ctx].astype(np.int64)) for j in i])
    return x, y


model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = at.scaler()
for _ in range(args.steps):
    for _micro in range(args.accum):
        x, y = get_batch()
        with at.autocast():
            loss = nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / args.accum
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
