"""A plain script that keeps its own batch: no at.batch_size(), its DataLoader built with batch_size=16
through an argparse option and a variable, and its own accumulation (--accum micro-batches per optimizer
step, default 1). It seeds torch and shuffles through its DataLoader (tests/trial/loop/script/test_records.py).

Usage: keeps_16.py [--steps N] [--accum A] [--batch-size B]
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10_000)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--accum", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(512, 8)
data = TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(512, 1))
bs = args.batch_size
loader = DataLoader(data, batch_size=bs, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
while step < args.steps:
    for i, (xb, yb) in enumerate(loader):
        (nn.functional.mse_loss(model(xb), yb) / args.accum).backward()
        if (i + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            step += 1
