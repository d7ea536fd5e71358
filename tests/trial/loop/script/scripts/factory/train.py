"""A training script whose DataLoader and optimizer are built by factories it imports, not in its own file:
from a package beside it (`--lib beside`: src/helpers/data.py, its folder put on sys.path as a src layout
does) or from an installed library (`--lib installed`: ../factory_lib/fastdata, on the path as pip would put it), the
loader a subclass there. Its model is a task wrapper
(the model and its loss in one module) around a net with repeated blocks. `-j`, `-b` and `--pin-mem` are its
own options, as timm's train.py has them; `--distributed` sets up its process group and DDP, which its flags
leave off unless given. `--record DIR` writes a checksum of its parameters after each step to
DIR/rank{RANK}.json."""

import argparse
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--lib", choices=("beside", "installed"), default="beside")
parser.add_argument("-b", "--batch-size", type=int, default=8)
parser.add_argument("-j", "--workers", type=int, default=0)
parser.add_argument("--pin-mem", action="store_true")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--distributed", action="store_true")
parser.add_argument("--record")
args = parser.parse_args()

if args.lib == "beside":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
    from helpers.data import create_loader, create_optimizer, random_seed
else:
    from fastdata import create_loader, create_optimizer, random_seed

if args.distributed:
    torch.distributed.init_process_group("gloo")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.conv(x))


class Net(nn.Module):
    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class Task(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.loss = model, nn.MSELoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), y)

    def to(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        # As timm's training task: its own `to`, which reads a device and dtype and takes no memory format.
        dummy = torch.empty(0).to(*args, **kwargs)
        return super().to(device=dummy.device, dtype=dummy.dtype)


random_seed(0, int(os.environ.get("RANK", "0")))  # seeded by the library, per rank as timm does
images = torch.randn(256, 3, 16, 16, generator=torch.Generator().manual_seed(0))
data = TensorDataset(images, images.mean((1, 2, 3)).unsqueeze(1))
loader = create_loader(data, batch_size=args.batch_size, num_workers=args.workers, pin_memory=args.pin_mem)
task = Task(Net())
if args.distributed:
    task = nn.parallel.DistributedDataParallel(task)
optimizer = create_optimizer(task, lr=0.01)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = task(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.record:
            rank = os.environ.get("RANK", "0")
            sums = [p.detach().double().sum().item() for p in task.parameters()]
            with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
                json.dump({"step": step, "batch": len(x), "params": sums}, f)
        step += 1
        if step == args.steps:
            break
