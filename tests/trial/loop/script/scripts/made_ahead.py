"""A plain script whose DataLoader shows how far ahead its workers made batches (tests/trial/loop/script/test_running.py).

Usage: made_ahead.py FOLDER. Each item the dataset makes leaves a file in FOLDER/made (in the loader's
worker processes). The first step waits, as a slow first step does on a GPU (cuDNN autotuning,
compilation), until the loader has made every batch it can make ahead, then writes how many items were
made by then to FOLDER/by_first_step.
"""

import itertools
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

WAIT_S = 60.0  # the loader makes a few tiny batches in well under a second; this bounds a broken test
folder = Path(sys.argv[1])
made = folder / "made"
made.mkdir(parents=True, exist_ok=True)


class Stamped(Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(0))
        self.count = itertools.count()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        (made / f"{os.getpid()}-{next(self.count)}").touch()  # each worker process counts its own
        return self.x[i], self.x[i].sum(0, keepdim=True)


loader = DataLoader(Stamped(), batch_size=4, shuffle=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
ahead = loader.num_workers * (loader.prefetch_factor or 0)  # as the trial set them
for step, (x, y) in enumerate(loader):
    if step == 0:
        deadline = time.monotonic() + WAIT_S
        while len(os.listdir(made)) < (1 + ahead) * loader.batch_size and time.monotonic() < deadline:
            time.sleep(0.01)
        (folder / "by_first_step").write_text(str(len(os.listdir(made))))
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
