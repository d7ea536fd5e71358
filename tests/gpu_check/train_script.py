"""A user's training script as most are written, for scripts/gpu_check.sh's script rows (and their CPU test,
tests/test_gpu_check.py): it picks the GPU when there is one, and under torchrun (WORLD_SIZE > 1) it sets up
its own process group, wraps its model in DDP and shards its data with a DistributedSampler, keeping its
per-rank batch. The lines marked `# at` are the cooperative calls; outside a trial each is the identity, so
`python train_script.py` and `torchrun --nproc-per-node 2 train_script.py` train as written.

Its data is made in memory (no folder to read): 32x32 noise images, the target a blurred threshold of them.
NCCL refuses two ranks on one GPU, so with fewer GPUs than ranks the ranks share them over gloo, as
autotune's own DDP does on a one-GPU machine.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from autotune import script as at  # at


class Noise(Dataset):
    """`n` images, each made from its own index (the same in any worker process)."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(3, self.size, self.size, generator=torch.Generator().manual_seed(i))
        y = (nn.functional.avg_pool2d(x.mean(0, keepdim=True), 5, stride=1, padding=2) > 0).float()
        return x, y


def net(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 1, 1),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if world > 1:
        backend = "nccl" if cuda and torch.cuda.device_count() >= world else "gloo"
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
    torch.manual_seed(at.seed(0))  # at
    data = Noise(256, args.size)
    sampler = DistributedSampler(data, shuffle=True) if world > 1 else None
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                        num_workers=args.workers, drop_last=True)  # fmt: skip
    model = at.model(net(args.width).to(device))  # at
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = nn.BCEWithLogitsLoss()
    scaler = at.scaler()  # at
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with at.autocast():  # at
                loss = criterion(model(x).float(), y)
            scaler.scale(loss).backward()  # at: was loss.backward()
            scaler.step(optimizer)  # at: was optimizer.step()
            scaler.update()  # at
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
