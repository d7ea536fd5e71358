"""The few lines a script adds for the knobs torch offers no seam for: `from autotune import script as at`.

    with at.autocast():                 # the trial's precision (torch.autocast); fp32: nothing
        loss = criterion(model(x), y)
    scaler = at.scaler()                # a GradScaler, enabled only when the trial runs fp16
    model = at.model(model)             # channels_last and torch.compile, when the trial asks
    torch.manual_seed(at.seed(0))       # the trial's seed, or the script's own default
    order = torch.Generator().manual_seed(at.data_seed(0))  # the data order (a script with no DataLoader)
    batch = at.batch_size(args.batch_size)  # the trial's micro-batch (batch_size is then searched)
    accum = at.accumulation(args.accum)     # micro-batches per step, at the study's global batch
    lr = at.lr(args.lr)                     # the lr for the trial's global batch (optional: see lr())

Outside a trial (`python train.py`) each call is the identity: autocast() is a null context, scaler()
a disabled GradScaler (its scale() returns the loss, its step() calls optimizer.step()), model() returns
the model, and seed, data_seed, batch_size, accumulation and lr return their default. autotune.trial.loop.script
installs the trial's settings here before it runs the script, in the same process. Importing this module imports nothing heavy: torch is
imported inside the calls, once the script has it loaded already.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["accumulation", "autocast", "batch_size", "data_seed", "lr", "model", "scaler", "seed"]


@dataclass
class Trial:
    """The settings of the trial running in this process, and what the script's calls did with them."""

    precision: str = "fp32"
    channels_last: bool = False
    compile: str = "off"
    compile_backend: str = "inductor"
    seed: int = 0
    data_seed: int | None = None  # the data order; None: seed
    device_type: str = "cpu"
    # The micro-batch and micro-batches per step the trial hands over; None: the script's own default.
    batch_size: int | None = None
    accumulation: int | None = None
    # The script's own micro-batch and accumulation as its source reads (the study's baseline), until
    # its calls hand over their defaults.
    own_batch_size: int | None = None
    own_accumulation: int = 1
    # The factor on the script's own lr for the global batch the trial runs, given the script's own
    # (micro-batch, accumulation); None: the lr is the script's.
    lr_scale: Callable[[int, int], float] | None = None
    calls: dict[str, int] = field(default_factory=dict)
    # What each call was given and returned: the script's own defaults, read back into `applied`.
    defaults: dict[str, Any] = field(default_factory=dict)
    returned: dict[str, Any] = field(default_factory=dict)
    scalers: list[Any] = field(default_factory=list)
    models: list[Any] = field(default_factory=list)

    def called(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def handed(self, name: str, default: Any, value: Any) -> Any:
        """Record the script's own default and what the trial handed back for it (the first call's)."""
        self.called(name)
        self.defaults.setdefault(name, default)
        self.returned.setdefault(name, value)
        return value

    def own(self) -> tuple[int, int] | None:
        """The script's own (micro-batch, accumulation): its calls' defaults, else what its source reads."""
        b = self.defaults.get("batch_size", self.own_batch_size)
        return None if b is None else (int(b), int(self.defaults.get("accumulation", self.own_accumulation)))

    def lr_factor(self) -> float:
        """The factor on the script's own lr for this trial's global batch (1: its own batch)."""
        own = self.own()
        return 1.0 if own is None or self.lr_scale is None else self.lr_scale(*own)


_trial: Trial | None = None


def install(trial: Trial | None) -> None:
    """Set (or, with None, clear) the trial this process runs: autotune.trial.loop.script's call only."""
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


def data_seed(default: int = 0) -> int:
    """The trial's data-order seed: parity's data-order twin changes it and keeps seed(), so a script that
    draws its batches itself (no DataLoader: a get_batch over a memmap) seeds its sampling with this to be
    reshuffled like a DataLoader is. The trial's seed when the config sets no data seed; else `default`."""
    t = _trial
    if t is None:
        return default
    t.called("data_seed")
    return t.seed if t.data_seed is None else t.data_seed


def _whole(name: str, default: Any) -> int:
    """`default` as an int (a numpy integer too); in a trial only: outside one every call is the identity."""
    try:
        n = operator.index(default)
    except TypeError:
        n = 0
    if isinstance(default, bool) or n < 1:
        raise ValueError(f"at.{name}({default!r}): expected a whole number >= 1")
    return n


def batch_size(default: int) -> int:
    """The trial's micro-batch (samples per forward and backward), else the script's own `default`.

    Build the batches with it (a DataLoader's batch_size, a get_batch(n)): a script that calls it has
    batch_size searched, and `default` is its baseline."""
    t = _trial
    if t is None:
        return default
    own = _whole("batch_size", default)
    return int(t.handed("batch_size", own, own if t.batch_size is None else t.batch_size))


def accumulation(default: int = 1) -> int:
    """Micro-batches per optimizer step: the trial's when the study fixes the global batch
    (--global-batch = batch_size x accumulation), else the script's own `default`."""
    t = _trial
    if t is None:
        return default
    own = _whole("accumulation", default)
    return int(t.handed("accumulation", own, own if t.accumulation is None else t.accumulation))


def lr(default: float) -> float:
    """The script's `default` lr scaled for the trial's global batch by the study's rule (linear for SGD,
    sqrt for the Adam family, or --lr-scaling); `default` outside a trial or at the script's own batch.

    Not needed for an lr handed to the optimizer's constructor (the trial scales that itself); call it
    where the script sets the lr some other way (OneCycleLR's max_lr, its own warm-up arithmetic)."""
    t = _trial
    if t is None:
        return default
    return float(t.handed("lr", default, default * t.lr_factor()))
