"""A token model's script with no DataLoader: batches from a numpy memmap through its own get_batch,
gradient accumulation, GradScaler through at.scaler(), a warm-up schedule, and its batch handed over
(at.batch_size, at.accumulation), so its micro-batch and global batch can be searched. The optimizer is
AdamW; the tests write the same script with SGD."""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from autotune import script as at

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

torch.manual_seed(at.seed(0))
order = torch.Generator().manual_seed(at.data_seed(0))
path = Path(tempfile.mkdtemp()) / "tokens.bin"
# A learnable stream: each token is the previous one plus 1 or 2 (mod 32).
steps = np.random.default_rng(0).integers(1, 3, 8192)
(np.cumsum(steps) % 32).astype(np.uint16).tofile(path)
data = np.memmap(path, dtype=np.uint16, mode="r")
CTX = 8


def get_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.randint(len(data) - CTX - 1, (n,), generator=order).tolist()
    x = torch.from_numpy(np.stack([data[j : j + CTX] for j in i]).astype(np.int64))
    y = torch.from_numpy(np.stack([data[j + 1 : j + 1 + CTX] for j in i]).astype(np.int64))
    return x, y


batch = at.batch_size(args.batch_size)
accum = at.accumulation(args.accum)
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
scaler = at.scaler()
for _ in range(args.steps):
    for _micro in range(accum):
        x, y = get_batch(batch)
        with at.autocast():
            loss = nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten()) / accum
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    warmup.step()
    optimizer.zero_grad(set_to_none=True)
print(f"loss {loss.item() * accum:.4f}")
