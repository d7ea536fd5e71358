"""optimizer_fusion's seam on an unedited script's optimizer: the fused/foreach pair set on every param group
of an optimizer that holds both, whatever its class; one without the pair keeps its own; what ran is read
back off the group."""

from __future__ import annotations

import pytest
import torch

from autotune.trial.loop.knobs.optimizer_fusion import fusion_of, seam


@pytest.mark.parametrize("value", ["none", "foreach", "fused"])
def test_the_pair_is_set_on_every_group_and_read_back(value: str) -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.1}], lr=0.01)
    seam(opt, value)
    assert [fusion_of(g) for g in opt.param_groups] == [value, value]
    assert opt._step_supports_amp_scaling is (value == "fused")  # a fused step unscales in its kernel
    (a(torch.randn(3, 2)).sum() + b(torch.randn(3, 2)).sum()).backward()
    opt.step()  # the implementation set runs


def test_an_optimizer_without_the_pair_keeps_its_own() -> None:
    opt = torch.optim.LBFGS(torch.nn.Linear(2, 2).parameters())
    seam(opt, "fused")
    assert "fused" not in opt.param_groups[0] and fusion_of(opt.param_groups[0]) == "unknown"
