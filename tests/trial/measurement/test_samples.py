"""autotune/trial/measurement/samples.py: the one count of the samples a batch holds, whatever shape the
loader hands it over in."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autotune.trial.measurement.samples import batch_len


@pytest.mark.parametrize(
    "batch, n",
    [
        (torch.zeros(6, 3), 6),  # a tensor: its first dimension
        ((torch.zeros(4, 3), torch.zeros(4)), 4),  # (inputs, targets)
        ({"input_ids": torch.zeros(5, 7), "labels": torch.zeros(5, 7)}, 5),  # a tokenizer's dict
        ([[torch.zeros(3, 2), torch.zeros(3, 2)], torch.zeros(3)], 3),  # nested: ((x, y), z) collated
        ({"inputs": {"pixels": torch.zeros(2, 3, 4, 4)}}, 2),  # nested dicts
        ((torch.zeros(0, 3), torch.zeros(9)), 9),  # an empty first tensor counts nothing: the next counts
        (torch.tensor(1.0), 1),  # a 0-d tensor: one sample
        ([], 1),  # nothing to count
    ],
)
def test_a_batch_holds_the_first_dimension_of_its_first_tensor(batch: Any, n: int) -> None:
    assert batch_len(batch) == n
