"""core/knobs/tf32.py: TF32 is a process flag that changes the training math (parity checks it), fixed off
without CUDA, set by name before the job runs, and written by every export."""

from __future__ import annotations

import torch

from autotune.core.config import TrialConfig
from autotune.core.knobs import tf32
from autotune.core.training import training_math
from autotune.search.space.machine import Hardware
from autotune.search.space.reading import load_space
from autotune.search.space.resolve import NO_EFFECT_WITHOUT_CUDA, for_hardware
from autotune.search.space.spec import DEFAULT_SPACE, Choices, Fixed
from autotune.trial.loop import knobs as torch_side

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)
GPU = Hardware(cuda=True, gpu_count=1, cpu_count=8, apex=False)


def test_it_is_a_precision_class_for_parity() -> None:
    assert training_math(TrialConfig(tf32=True), batch_norm=False) == ["tf32 off -> on"]
    assert training_math(TrialConfig(), batch_norm=False) == []


def test_it_is_searched_on_cuda_and_fixed_off_without_it_with_the_reason() -> None:
    on_cpu, notes = for_hardware(load_space(DEFAULT_SPACE), CPU)
    assert on_cpu["tf32"] == Fixed(False)
    assert any(n.startswith("tf32 fixed to False: no CUDA") for n in notes), notes
    assert "tf32" in NO_EFFECT_WITHOUT_CUDA  # the diff never writes it from a study made on a CPU
    on_gpu, _ = for_hardware(load_space(DEFAULT_SPACE), GPU)
    assert on_gpu["tf32"] == Choices((False, True))


def test_the_trial_sets_both_flags_by_name_and_says_a_cpu_has_none() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False  # conftest restores the flags after the test
    applied = torch_side.setup_process(TrialConfig(tf32=True), torch.device("cpu"))
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
    assert applied["tf32"] == {"requested": True, "in_effect": False, "why": tf32.NO_CUDA}
    torch.backends.cuda.matmul.allow_tf32 = False
    applied = torch_side.setup_process(TrialConfig(), torch.device("cpu"))
    assert torch.backends.cuda.matmul.allow_tf32 is False  # off: torch's own default, untouched
    assert applied["tf32"] == {"requested": False, "in_effect": False}


def test_every_export_writes_it() -> None:
    from autotune.apply.export import _compute

    cfg = TrialConfig(tf32=True)
    flags = [
        "torch.backends.cuda.matmul.allow_tf32 = True  # autotune: tf32",
        "torch.backends.cudnn.allow_tf32 = True  # autotune: tf32",
    ]
    assert _compute.script_lines(cfg)[1:] == flags
    assert _compute.lightning_extra(cfg)[:2] == flags
    assert "    tf32=True,  # tf32: sets both flags" in _compute.hf_args(cfg)
    assert _compute.script_lines(TrialConfig()) == ["torch.backends.cudnn.benchmark = False"]
