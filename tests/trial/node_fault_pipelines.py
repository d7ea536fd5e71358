"""Pipelines for trials that span nodes (tests/trial/processes/test_torchx_nodes.py).

Named as `tests.trial.node_fault_pipelines:<factory>` in TrialConfig.pipeline.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from tests.fault_pipelines import HANG_S, SlowPipeline


class HangOnRankZero(SlowPipeline):
    """~0.1 s steps; from its 4th loss on, global rank 0 sleeps (not in a collective: nothing in torch will
    notice a dead peer), and its peers wait for it in DDP's all-reduce. The first throughput window
    (warm-up 1 + 2 timed steps) is written before the hang."""

    calls = 0

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= 4 and os.environ.get("RANK") == "0":
            time.sleep(HANG_S)
        return super().loss(output, target)


def hang_rank0(cfg: Any) -> HangOnRankZero:
    return HangOnRankZero(cfg)
