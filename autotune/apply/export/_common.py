"""What the framework renderings and their concept modules share: where accelerate's export puts what its
config cannot hold, and the accelerator a trial ran on."""

from __future__ import annotations

# A knob accelerate's config file cannot hold stays in the training script, which its export shows.
IN_SCRIPT = "not an accelerate setting: in train.py (below)"


def accelerator(device: str | None) -> str:
    """A trial records "cpu", or the GPU's name ("NVIDIA H200"): anything but cpu was measured on a GPU."""
    if not device:
        return "auto"
    return "cpu" if device.startswith("cpu") else "gpu"
