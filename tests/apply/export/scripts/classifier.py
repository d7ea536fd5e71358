"""A small classifier in the shape of pytorch/examples' imagenet script: its own argparse (-j/--workers), a
training loader and a validation loader iterated only after an epoch, pinned memory asked for, and its
optimizer built in the model's own module (as nanoGPT's model.configure_optimizers does). No autotune line:
the loader and optimizer knobs reach it through torch's own seams."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from tinymodel import Net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    val = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train_loader = DataLoader(train, batch_size=8, shuffle=True, num_workers=args.workers, pin_memory=True)
    val_loader = DataLoader(val, batch_size=8, num_workers=0, pin_memory=True)
    model = Net()
    optimizer = model.configure_optimizers(lr=1e-3)
    step = 0
    while step < args.steps:
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.steps:
                break
        with torch.no_grad():
            right = sum(int((model(x).argmax(1) == y).sum()) for x, y in val_loader)
        print(f"step {step}: loss {loss.item():.4f}, validation {right}/{len(val)}", flush=True)


if __name__ == "__main__":
    main()
