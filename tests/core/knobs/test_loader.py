"""core/knobs/loader.py: the DataLoader's four knobs, one dictionary that every job's DataLoader gets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from autotune.core.config import TrialConfig
from autotune.core.knobs import loader

DATA = TensorDataset(torch.zeros(8, 1))


def test_without_workers_persistence_is_off_and_nothing_is_prefetched_whatever_the_script_gave() -> None:
    assert loader.arguments(TrialConfig(num_workers=0, pin_memory=True)) == {
        "num_workers": 0,
        "pin_memory": True,
        "persistent_workers": False,
        "prefetch_factor": None,
    }
    # The script's own persistence and prefetch would make DataLoader refuse a loader with no workers.
    own = {"persistent_workers": True, "prefetch_factor": 4}
    built = DataLoader(DATA, **(own | loader.arguments(TrialConfig())))
    assert built.num_workers == 0 and not built.persistent_workers
    with pytest.raises(ValueError):
        DataLoader(DATA, **own)


def test_with_workers_the_prefetch_left_to_torch_is_its_two_and_a_built_loader_reads_back_as_its_config() -> None:
    cfg = TrialConfig(num_workers=2, persistent_workers=True)
    assert loader.arguments(cfg)["prefetch_factor"] == 2
    built = DataLoader(DATA, **loader.arguments(cfg))
    assert loader.own(built) == loader.arguments(cfg)


def test_transformers_fields_read_back_as_the_same_knobs() -> None:
    cfg = TrialConfig(num_workers=3, pin_memory=True, persistent_workers=True, prefetch_factor=4)
    args = SimpleNamespace(**loader.hf_fields(cfg))
    assert loader.hf_own(args) == loader.arguments(cfg)
    assert loader.hf_lines(cfg)[0] == "    dataloader_num_workers=3,"
    assert loader.script_lines(TrialConfig()) == ["DataLoader(..., num_workers=0, pin_memory=False)"]
