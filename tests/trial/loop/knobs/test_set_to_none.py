"""set_to_none's seam on an unedited script's zero_grad: the trial's value over each call's own (none over
it in the baseline, which runs as written), every call recorded."""

from __future__ import annotations

import torch

from autotune.trial.loop.knobs.set_to_none import seam


def _stepped() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    model = torch.nn.Linear(2, 2)
    model(torch.randn(3, 2)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_the_trial_s_value_wins_over_the_call_s_and_each_call_is_recorded() -> None:
    calls: list[bool] = []
    zero_grad = seam(torch.optim.Optimizer.zero_grad, False, calls)
    model, opt = _stepped()
    zero_grad(opt)  # the call's own: torch's default, True
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    module_zero_grad = seam(torch.nn.Module.zero_grad, True, calls)
    module_zero_grad(model, set_to_none=False)
    assert all(p.grad is None for p in model.parameters()) and calls == [False, True]


def test_as_written_each_call_keeps_its_own() -> None:
    calls: list[bool] = []
    zero_grad = seam(torch.optim.Optimizer.zero_grad, None, calls)
    model, opt = _stepped()
    zero_grad(opt, set_to_none=False)
    assert all(p.grad is not None for p in model.parameters()) and calls == [False]
