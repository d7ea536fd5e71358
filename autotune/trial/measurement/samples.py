"""How many samples a batch holds: the one count every measured run uses for the batches a loader handed
over (a trial's seams, the clock's `delivered`, a script run alone), so a figure in samples/s means the
same thing wherever it was measured.

May import: torch.
"""

from __future__ import annotations

from typing import Any

import torch


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (tuples, lists, dicts, nested); 1 without
    one (a 0-d tensor, or a batch with no tensor in it)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_len(item)
        if n:
            return n
    return 1
