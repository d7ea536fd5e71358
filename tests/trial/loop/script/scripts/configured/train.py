"""A token model trained as nanoGPT's train.py is written: its settings are globals, overridden by a
configurator it exec()s (`--batch_size=6`, or a config file), so its batch size is set twice before it is
handed over: `batch_size = at.batch_size(batch_size)` (tests/pipelines/test_script_batch.py). No DataLoader:
a get_batch over a tensor, seeded, its sampling drawn from at.data_seed()."""

import os

import torch
from torch import nn

from autotune import script as at

batch_size = 12
learning_rate = 1e-2
max_iters = 100_000
exec(open(os.path.join(os.path.dirname(__file__), "configurator.py")).read())
batch_size = at.batch_size(batch_size)

torch.manual_seed(at.seed(1337))
order = torch.Generator().manual_seed(at.data_seed(0))
data = torch.cumsum(torch.randint(1, 3, (8192,), generator=torch.Generator().manual_seed(0)), 0) % 32
CTX = 8


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.randint(len(data) - CTX - 1, (batch_size,), generator=order)
    return torch.stack([data[j : j + CTX] for j in i]), torch.stack([data[j + 1 : j + 1 + CTX] for j in i])


model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
for _ in range(max_iters):
    x, y = get_batch()
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
