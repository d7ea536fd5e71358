"""A token model trained as nanoGPT's train.py is written, with no autotune line and no DataLoader: its settings
are globals its configurator overrides (`--batch_size=12`), and get_batch draws each batch itself. Its source
says nothing of the batch a run trains on: what its model is fed shows it."""

import os

import torch
from torch import nn

batch_size = 8
gradient_accumulation_steps = 1
max_iters = 100_000
exec(open(os.path.join(os.path.dirname(__file__), "configurator.py")).read())

torch.manual_seed(1337)
data = torch.cumsum(torch.randint(1, 3, (8192,), generator=torch.Generator().manual_seed(0)), 0) % 32
CTX = 8


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - CTX - 1, (batch_size,))
    x = torch.stack([data[i : i + CTX] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + CTX] for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class GPT(nn.Module):
    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 32)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.view(-1, 32), targets.view(-1))


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _it in range(max_iters):
    for _micro in range(gradient_accumulation_steps):
        X, Y = get_batch()
        loss = model(X, Y) / gradient_accumulation_steps
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
