"""A script whose DataLoader reads an IterableDataset that does not shard itself over workers."""

import torch
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(400):
            x = torch.randn(8, generator=g)
            yield x, x.sum(0, keepdim=True)


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
for xb, yb in DataLoader(Stream(), batch_size=16):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    optimizer.step()
