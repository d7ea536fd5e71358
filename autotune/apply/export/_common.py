"""What the framework renderings and their concept modules share: where accelerate's export puts what its
config cannot hold, and the accelerator a trial ran on."""

from __future__ import annotations

from autotune.core.knobs.row import IN_SCRIPT as IN_SCRIPT  # what accelerate's config file cannot hold


def accelerator(device: str | None) -> str:
    """A trial records "cpu", or the GPU's name ("NVIDIA H200"): anything but cpu was measured on a GPU."""
    if not device:
        return "auto"
    return "cpu" if device.startswith("cpu") else "gpu"
