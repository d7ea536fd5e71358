"""An installed library's factories (on the path, outside the script's folder, as timm's create_loader and
create_optimizer are): its own DataLoader subclass, and SGD."""

import torch
from torch.utils import data


class FastLoader(data.DataLoader):
    """A library's DataLoader subclass: it builds through DataLoader.__init__ all the same."""

    def __init__(self, dataset, batch_size, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(dataset, batch_size=batch_size, shuffle=True, drop_last=True, **kwargs)


def create_loader(dataset, batch_size, num_workers=0, pin_memory=False):  # type: ignore[no-untyped-def]
    return FastLoader(dataset, batch_size, num_workers=num_workers, pin_memory=pin_memory)


def create_optimizer(model, lr):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


class Task(torch.nn.Module):
    """A task wrapper: the model and its loss in one module, as a library's training task holds them."""

    def __init__(self, model, loss):  # type: ignore[no-untyped-def]
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x, y):  # type: ignore[no-untyped-def]
        return self.loss(self.model(x), y)


def random_seed(seed=42, rank=0):  # type: ignore[no-untyped-def]
    """As timm.utils.random_seed: torch seeded inside the library, not in the script's source."""
    torch.manual_seed(seed + rank)
