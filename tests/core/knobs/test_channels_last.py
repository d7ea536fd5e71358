"""channels_last's diff lines do what the trial did to an unedited script's model: its weights and its 4-D
floating inputs in the channels-last format, an integer image (uint8, as a decoder loads it) left as loaded."""

from __future__ import annotations

import torch

from autotune.core.knobs import channels_last
from autotune.trial.loop.knobs.channels_last import inputs


def test_the_diff_s_lines_convert_the_inputs_the_trial_converts() -> None:
    net = torch.nn.Conv2d(3, 4, 3)
    names = {"torch": torch, "net": net}
    exec("\n".join(line.format(m="net") for line in channels_last.LINES), names)  # as the diff writes them
    assert net.weight.is_contiguous(memory_format=torch.channels_last)
    hook = next(iter(net._forward_pre_hooks.values()))
    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, 3, 8, 8)
    written, trial = hook(net, images), inputs(images)
    for a, b in zip(written, trial):
        assert a.dtype == b.dtype and a.stride() == b.stride()
    assert written[0].is_contiguous() and written[1].is_contiguous(memory_format=torch.channels_last)
