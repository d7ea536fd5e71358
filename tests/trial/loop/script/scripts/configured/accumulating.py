"""A token model trained as llama2.c's train.py is written: its settings are globals a configurator
overrides (`--batch_size=6 --gradient_accumulation_steps=2 --learning_rate=0.005`), its batch is handed over
after that (`batch_size = at.batch_size(batch_size)`), and it accumulates micro-batches from a DataLoader over
an IterableDataset on its own (no at.accumulation()), setting its optimizer's lr itself before every step
(a warm-up then constant). What trial 0 must read at run time: the batch, the accumulation, the lr."""

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from autotune import script as at

batch_size = 12
gradient_accumulation_steps = 1
learning_rate = 1e-2
warmup_iters = 3
max_iters = 100_000
exec(open(os.path.join(os.path.dirname(__file__), "configurator.py")).read())
batch_size = at.batch_size(batch_size)

torch.manual_seed(at.seed(1337))
data = torch.cumsum(torch.randint(1, 3, (8192,), generator=torch.Generator().manual_seed(0)), 0) % 32
CTX = 8


class Tokens(IterableDataset):
    def __iter__(self):
        order = torch.Generator().manual_seed(at.data_seed(0))
        while True:
            j = int(torch.randint(len(data) - CTX - 1, (1,), generator=order))
            yield data[j : j + CTX], data[j + 1 : j + 1 + CTX]


def get_lr(it: int) -> float:
    return learning_rate * min(1.0, (it + 1) / warmup_iters)


batches = iter(DataLoader(Tokens(), batch_size=batch_size))
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
for it in range(max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(it)
    for _ in range(gradient_accumulation_steps):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
