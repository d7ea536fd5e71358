"""A plain script that seeds torch only when it is given --seed, as many examples do (tests/search/checks/
test_parity.py): run as written, no two runs are promised the same weights. A shuffling DataLoader, AdamW.

Usage: seed_flag.py [--seed S] [--steps N]
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--steps", type=int, default=10_000)
args = parser.parse_args()

if args.seed is not None:
    torch.manual_seed(args.seed)
x = torch.linspace(-1, 1, 256).reshape(64, 4)
data = TensorDataset(x, x.sum(1, keepdim=True))
loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0
while step < args.steps:
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
        step += 1
