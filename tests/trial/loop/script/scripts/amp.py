"""A small AMP script for the script trial's seams (tests/trial/loop/test_script_trial.py): its model stays
on the CPU whatever the machine has and is handed to at.model(); at.autocast() is given the script's own
precision; a GradScaler of its own or at.scaler()'s; an optimizer built fused or not. Alone it trains as
the flags say.

Usage: amp.py [--own fp32|bf16|fp16] [--outer] [--fused] [--scaler none|at|own] [--discard] [--steps N]
  --outer    its own torch.autocast("cpu", bfloat16) around at.autocast(), as the script ran before the edit
  --scaler   at: at.scaler(own=True) (its own GradScaler, enabled alone); own: torch.amp.GradScaler("cpu")
  --discard  it keeps running the model it passed to at.model(), not the one returned
"""

import argparse
import contextlib

import torch
from torch import nn

from autotune import script as at

parser = argparse.ArgumentParser()
parser.add_argument("--own", default="fp32")
parser.add_argument("--outer", action="store_true")
parser.add_argument("--fused", action="store_true")
parser.add_argument("--scaler", default="none", choices=["none", "at", "own"])
parser.add_argument("--discard", action="store_true")
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

torch.manual_seed(at.seed(0))
order = torch.Generator().manual_seed(at.data_seed(0))
x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
y = x.sum(1, keepdim=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
returned = at.model(model)
if not args.discard:
    model = returned
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if args.fused else None)
scaler = at.scaler(own=True) if args.scaler == "at" else torch.amp.GradScaler("cpu") if args.scaler == "own" else None
for _ in range(args.steps):
    i = torch.randint(0, len(x), (16,), generator=order)
    outer = torch.autocast("cpu", dtype=torch.bfloat16) if args.outer else contextlib.nullcontext()
    with outer:
        with at.autocast(args.own):
            out = model(x[i])
        loss = nn.functional.mse_loss(out.float(), y[i])
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad()
