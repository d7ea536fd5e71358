"""A script whose DataLoader sets its own workers and whose optimizer is fused: the baseline keeps both."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

workers = int(sys.argv[1])
x = torch.randn(512, 8)
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16, num_workers=workers)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
for _ in range(10):
    for xb, yb in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
