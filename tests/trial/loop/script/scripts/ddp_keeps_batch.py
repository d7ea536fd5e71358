"""A DDP script that keeps its per-rank batch under torchrun: each rank trains at.batch_size() x
at.accumulation() per optimizer step, so 2 ranks train twice its own global batch
(tests/trial/loop/test_script_ddp.py). Alone (no WORLD_SIZE) it runs as one process.

Usage: ddp_keeps_batch.py OUT [--steps N] [--batch-size B] [--accum A]. Each rank writes the lr its
optimizer steps with to OUT/lr.rankR, after its schedule's step.
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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
accum = at.accumulation(args.accum)
x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
data = TensorDataset(x, x.sum(1, keepdim=True))
sampler = DistributedSampler(data, seed=0) if ddp else None
loader = DataLoader(data, batch_size=batch, sampler=sampler, shuffle=sampler is None, drop_last=True)
model = at.model(nn.Linear(8, 1))
net = DistributedDataParallel(model) if ddp else model
optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # computed from its base lr
steps = 0
for epoch in range(args.steps):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        with at.autocast():
            loss = nn.functional.mse_loss(net(xb), yb) / accum
        loss.backward()
        if (i + 1) % accum:
            continue
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        (args.out / f"lr.rank{rank}").write_text(repr(optimizer.param_groups[0]["lr"]))
        steps += 1
        if steps == args.steps:
            break
    if steps == args.steps:
        break
if ddp:
    dist.destroy_process_group()
