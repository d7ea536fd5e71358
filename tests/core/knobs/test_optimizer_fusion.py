"""core/knobs/optimizer_fusion.py: the optimizer's implementation, its rule on a machine and its Trainer terms."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from autotune.core.knobs import optimizer_fusion
from autotune.core.knobs.row import Drop


def test_apex_is_dropped_where_it_does_not_import() -> None:
    assert optimizer_fusion.machine(SimpleNamespace(cuda=True, cpu_bf16=True, cpu_count=2, apex=True)) == []
    (rule,) = optimizer_fusion.machine(SimpleNamespace(cuda=True, cpu_bf16=True, cpu_count=2, apex=False))
    assert isinstance(rule, Drop) and rule.values == ("apex",)


def test_each_torch_value_builds_the_implementation_it_names() -> None:
    p = [torch.nn.Parameter(torch.zeros(2))]
    for value, flags in optimizer_fusion.FLAGS.items():
        group = torch.optim.AdamW(p, **flags).param_groups[0]
        assert (bool(group["fused"]), bool(group["foreach"])) == (value == "fused", value == "foreach")


def test_a_trainer_on_another_optimizer_cannot_take_it_and_an_adamw_kernel_reads_back() -> None:
    assert optimizer_fusion.hf_unfit(SimpleNamespace(optim="adafactor")) is not None
    assert optimizer_fusion.hf_own(SimpleNamespace(optim="adafactor")) is None
    assert optimizer_fusion.hf_unfit(SimpleNamespace(optim="adamw_torch_fused")) is None
    assert optimizer_fusion.hf_own(SimpleNamespace(optim="adamw_torch_fused")) == "fused"
    assert optimizer_fusion.hf_own(SimpleNamespace(optim="adamw_torch")) == "none"  # torch picks: the first naming it
