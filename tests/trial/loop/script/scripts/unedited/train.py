"""A plain training script with no autotune line in it: a DataLoader, a conv stem and a ModuleList of
blocks, AdamW, and a loss computed outside the model (tests/trial/loop/test_unedited.py). `--own-autocast`
runs its forward under its own bf16 autocast; `--gan` builds a second model and optimizer, as a GAN does.
It prints each step's loss, and the dtype its loss was computed in. `--save PATH` saves its weights after its
first step, as a checkpoint; `--record DIR` writes what this process trained on (the sample indices of its first
pass) and its gradients after its first step to DIR/rank{RANK}.json, RANK as torchrun sets it."""

import argparse
import contextlib
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--own-autocast", action="store_true")
parser.add_argument("--gan", action="store_true")
parser.add_argument("--save")
parser.add_argument("--record")
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.conv(x))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((2, 3)))


torch.manual_seed(0)
images = torch.randn(256, 3, 16, 16, generator=torch.Generator().manual_seed(0))
data = TensorDataset(images, images.mean((1, 2, 3)).unsqueeze(1), torch.arange(len(images)))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if args.gan:
    critic = nn.Linear(1, 1)
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
ctx = torch.autocast("cpu", dtype=torch.bfloat16) if args.own_autocast else contextlib.nullcontext()
step, passes, seen = 0, 0, []
while step < args.steps:
    passes += 1
    for x, y, index in loader:
        seen += index.tolist() if passes == 1 else []
        with ctx:
            out = model(x)
        loss = nn.functional.mse_loss(out.view(args.batch_size), y.view(args.batch_size))  # outside the model
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.gan:
            critic_optimizer.zero_grad()
            critic(out.detach()).mean().backward()
            critic_optimizer.step()
        if step == 0 and args.save:
            torch.save(model.state_dict(), args.save)
        if args.record:
            if step == 0:
                grads = {n: p.grad.sum().item() for n, p in model.named_parameters()}
            record = {"indices": seen, "grads": grads}
            rank = os.environ.get("RANK", "0")
            with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
                json.dump(record, f)
        print(f"step {step} loss {loss.item()!r} {loss.dtype}")
        step += 1
        if step == args.steps:
            break
