"""autotune.script's at.autocast() and at.scaler() (issue 42): the script's own AMP is their argument,
what they do outside a trial and in the baseline; in another trial the trial's precision, on the device
the script's model lives on (not the machine's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from autotune import script as at
from autotune.pipelines.script import api


@pytest.fixture
def in_trial() -> Iterator[None]:
    yield
    api.install(None)


def test_outside_a_trial_the_script_s_own_amp_runs() -> None:
    model = at.model(torch.nn.Linear(2, 2))  # on the CPU: its autocast is the CPU's
    with at.autocast():
        assert not torch.is_autocast_enabled("cpu")
    for own in ("bf16", torch.bfloat16, "bfloat16"):
        with at.autocast(own):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert model(torch.ones(1, 2)).dtype == torch.bfloat16
    assert at.scaler(own=True).is_enabled() and not at.scaler().is_enabled()
    with pytest.raises(ValueError, match="expected one of fp32, fp16, bf16"):
        at.autocast("int8")


@pytest.mark.usefixtures("in_trial")
def test_the_baseline_runs_the_script_s_own_amp_and_another_trial_the_trial_s() -> None:
    api.install(api.Trial(precision="fp32", as_written=True))
    with at.autocast("bf16"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    assert at.scaler(own=True).is_enabled()
    api.install(trial := api.Trial(precision="fp32"))
    with at.autocast("bf16"):
        assert not torch.is_autocast_enabled("cpu")
    assert not at.scaler(own=True).is_enabled()
    assert trial.defaults == {"precision": "bf16", "scaler": True} and trial.autocasts == {"fp32 on cpu": 1}


@pytest.mark.usefixtures("in_trial")
def test_the_trial_s_autocast_runs_where_the_model_lives_not_on_the_machine_s_gpu() -> None:
    api.install(trial := api.Trial(precision="bf16", device_type="cuda"))  # the machine has a GPU
    model = at.model(torch.nn.Linear(2, 2))  # the script keeps its model on the CPU
    with at.autocast():
        assert torch.is_autocast_enabled("cpu") and model(torch.ones(1, 2)).dtype == torch.bfloat16
    assert trial.autocasts == {"bf16 on cpu": 1} and trial.tensor_device() == torch.device("cpu")


@pytest.mark.usefixtures("in_trial")
def test_an_outer_autocast_is_seen_and_the_trial_s_precision_runs_inside_it() -> None:
    api.install(trial := api.Trial(precision="fp32"))
    with torch.autocast("cpu", dtype=torch.bfloat16), at.autocast():
        assert not torch.is_autocast_enabled("cpu")  # an fp32 trial runs fp32 here
    assert trial.outer_autocast == {"device_type": "cpu", "dtype": "bfloat16"}
    api.install(trial := api.Trial(precision="fp32", as_written=True))
    with torch.autocast("cpu", dtype=torch.bfloat16), at.autocast():
        assert torch.is_autocast_enabled("cpu")  # the baseline: the script as it runs alone
    assert trial.outer_autocast == {"device_type": "cpu", "dtype": "bfloat16"}
