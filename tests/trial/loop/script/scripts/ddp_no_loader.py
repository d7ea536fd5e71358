"""A DDP script with no DataLoader that divides its accumulation by the world size under torchrun (as
nanoGPT's train.py does): each rank draws at.batch_size() rows itself, at.accumulation() // world times a
step, so its ranks together train its own global batch (tests/trial/loop/test_script_ddp.py). The trial
counts what its steps consumed (its backward passes), not what the calls were handed.

Usage: ddp_no_loader.py OUT [--steps N] [--batch-size B] [--accum A]. Each rank writes the lr its optimizer
steps with to OUT/lr.rankR.
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autotune import script as at

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--accum", type=int, default=2)
args = parser.parse_args()

ddp = int(os.environ.get("WORLD_SIZE", 1)) > 1
if ddp:
    dist.init_process_group("gloo")
rank = dist.get_rank() if ddp else 0
torch.manual_seed(at.seed(0))
batch = at.batch_size(args.batch_size)
accum = at.accumulation(args.accum) // (dist.get_world_size() if ddp else 1)
order = torch.Generator().manual_seed(at.data_seed(0) + rank)
x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
model = at.model(nn.Linear(8, 1))
net = DistributedDataParallel(model) if ddp else model
optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
for _ in range(args.steps):
    for _micro in range(accum):
        xb = x[torch.randint(len(x), (batch,), generator=order)]
        with at.autocast():
            loss = nn.functional.mse_loss(net(xb), xb.sum(1, keepdim=True)) / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    (args.out / f"lr.rank{rank}").write_text(repr(optimizer.param_groups[0]["lr"]))
if ddp:
    dist.destroy_process_group()
