"""The few lines a script adds for the knobs torch offers no seam for: `from autotune import script as at`.

    with at.autocast():                 # the trial's precision (torch.autocast); fp32: nothing
        loss = criterion(model(x), y)
    scaler = at.scaler()                # a GradScaler, enabled only when the trial runs fp16
    model = at.model(model)             # channels_last and torch.compile, when the trial asks
    torch.manual_seed(at.seed(0))       # the trial's seed, or the script's own default

Outside a trial (`python train.py`) each call is the identity: autocast() is a null context, scaler()
a disabled GradScaler (its scale() returns the loss, its step() calls optimizer.step()), model() returns
the model, seed(default) the default. autotune.trial.script installs the trial's settings here before
it runs the script, in the same process. Importing this module imports nothing heavy: torch is
imported inside the calls, once the script has it loaded already.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

__all__ = ["autocast", "model", "scaler", "seed"]


@dataclass
class Trial:
    """The settings of the trial running in this process, and what the script's calls did with them."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: str = "off"
    compile_backend: str = "inductor"
    seed: int = 0
    device_type: str = "cpu"
    calls: dict[str, int] = field(default_factory=dict)
    scalers: list[Any] = field(default_factory=list)
    models: list[Any] = field(default_factory=list)

    def called(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1


_trial: Trial | None = None


def install(trial: Trial | None) -> None:
    """Set (or, with None, clear) the trial this process runs: autotune.trial.script's call only."""
    global _trial
    _trial = trial


def autocast() -> contextlib.AbstractContextManager[Any]:
    """torch.autocast at the trial's precision on its device; a null context at fp32 or outside a trial."""
    t = _trial
    if t is None:
        return contextlib.nullcontext()
    t.called("autocast")
    if t.precision == "fp32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(t.device_type, dtype=torch.bfloat16 if t.precision == "bf16" else torch.float16)


def scaler() -> Any:
    """A torch.amp.GradScaler, enabled only when the trial runs fp16 (disabled: every call passes through)."""
    import torch

    t = _trial
    if t is None:
        return torch.amp.GradScaler("cpu", enabled=False)
    t.called("scaler")
    s = torch.amp.GradScaler(t.device_type, enabled=t.precision == "fp16")
    t.scalers.append(s)
    return s


def model(module: Any) -> Any:
    """The model in the trial's memory format (channels_last) and compiled when the trial compiles."""
    t = _trial
    if t is None:
        return module
    t.called("model")
    import torch

    if t.channels_last:
        module = module.to(memory_format=torch.channels_last)
    t.models.append(module)
    if t.compile != "off":
        mode = t.compile if t.compile_backend == "inductor" else None
        module = torch.compile(module, backend=t.compile_backend, mode=mode)
    return module


def seed(default: int = 0) -> int:
    """The trial's seed (parity trains two runs from the same one), else the script's own default."""
    t = _trial
    if t is None:
        return default
    t.called("seed")
    return t.seed
