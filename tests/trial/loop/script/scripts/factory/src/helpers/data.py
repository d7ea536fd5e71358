"""A module of a package beside the script that builds its DataLoader and optimizer (as a project's own
`helpers/` does): spelled through `tud.`, so the script's source names no DataLoader."""

import torch
import torch.utils.data as tud


def create_loader(dataset, batch_size, num_workers=0, pin_memory=False):  # type: ignore[no-untyped-def]
    return tud.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=num_workers, pin_memory=pin_memory
    )


def create_optimizer(model, lr):  # type: ignore[no-untyped-def]
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def random_seed(seed=42, rank=0):  # type: ignore[no-untyped-def]
    """As timm.utils.random_seed: torch seeded inside the library, not in the script's source."""
    torch.manual_seed(seed + rank)
