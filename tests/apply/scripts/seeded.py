"""A plain script that seeds its weights and its own sampling (no DataLoader) with seeds of its own, 1337
and 7, not autotune's 0, and prints each step's loss exactly (repr): `autotune run` must train the same
numbers as `python seeded.py` (tests/apply/test_run.py)."""

import sys

import torch
from torch import nn

from autotune import script as at

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
torch.manual_seed(at.seed(1337))
order = torch.Generator().manual_seed(at.data_seed(7))
data = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(steps):
    x = data[torch.randint(len(data), (8,), generator=order)]
    loss = (model(x).squeeze(1) - x.sum(1)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"loss {step} {loss.item()!r}")
