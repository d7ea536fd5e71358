"""trial/loop/knobs/checkpoint_segments.py: the activation memory checkpointing frees, counted at the model's first
forward. The bytes saved for backward split into held and freed exactly as the same model without checkpointing
saves them, checkpointing still recomputes (the gradients are the plain model's), and only the first forward
is counted."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from autotune.trial.loop.knobs import checkpoint_segments as checkpointing


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(4))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Distinct non-parameter bytes a plain forward saves for backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(seen.values())


def test_checkpointing_frees_what_the_checkpointed_blocks_would_hold() -> None:
    torch.manual_seed(0)
    plain, x = Net(), torch.randn(32, 8)
    model = copy.deepcopy(plain)
    total = saved_bytes(plain, x)
    chosen = checkpointing.apply(model, 2)
    assert chosen == list(model.blocks)[:2]
    counted = checkpointing.ActivationBytes(model, chosen)
    model(x).sum().backward()
    got = counted.observed()
    assert got is not None and got["freed"] > 0 and got["held"] > 0
    assert got["held"] + got["freed"] == total  # the same tensors, split by where they were saved
    # Two of four like blocks: the freed share is theirs, about half of the blocks' (the stem and head hold the rest).
    assert 0.3 < got["freed"] / total < 0.5, got
    # Checkpointing still ran (recomputed in backward): the gradients are the plain model's.
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    # Counted once: a second step neither counts nor leaves a hook behind.
    model(x).sum().backward()
    assert counted.observed() == got
    assert not model._forward_hooks and all(not b._forward_pre_hooks or len(b._forward_pre_hooks) == 1 for b in chosen)
    assert "freed (" in checkpointing.freed_said(got) and "MiB held" in checkpointing.freed_said(got)


def test_nothing_is_counted_without_grad() -> None:
    model = Net()
    chosen = checkpointing.apply(model, 4)
    counted = checkpointing.ActivationBytes(model, chosen)
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert counted.observed() is None
