"""What the framework renderings share: the accelerator a trial ran on."""

from __future__ import annotations


def accelerator(device: str | None) -> str:
    """A trial records "cpu", or the GPU's name ("NVIDIA H200"): anything but cpu was measured on a GPU."""
    if not device:
        return "auto"
    return "cpu" if device.startswith("cpu") else "gpu"
