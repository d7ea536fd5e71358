"""The few lines a script adds for the knobs torch offers no seam for: `from autotune import script as at`.

    with at.autocast():                 # the trial's precision (torch.autocast); fp32: nothing
        loss = criterion(model(x), y)
    scaler = at.scaler()                # a GradScaler, enabled only when the trial runs fp16
    model = at.model(model)             # the memory format and torch.compile, when the trial asks
    torch.manual_seed(at.seed(0))       # the script's own seed, always: it says the script seeds
    order = torch.Generator().manual_seed(at.data_seed(0))  # the data order (a script with no DataLoader)
    batch = at.batch_size(args.batch_size)  # the trial's micro-batch (batch_size is then searched)
    accum = at.accumulation(args.accum)     # micro-batches per step, at the study's global batch
    lr = at.lr(args.lr)                     # the lr for the trial's global batch (optional: see lr())

A script that ran its own AMP gives it as the argument: `at.autocast(torch.bfloat16)` (or "bf16"; fp16:
`at.autocast(torch.float16)` and `at.scaler(own=True)`). That is what the call does outside a trial and in
the baseline (trial 0, the script as written), so the search measures against what the user ran.

Outside a trial (`python train.py`) each call is what the script ran before the edit: autocast() a null
context (its own precision given: torch.autocast at it, on the device of the model handed to at.model()),
scaler() a disabled GradScaler (its scale() returns the loss, its step() calls optimizer.step(); enabled
with own=True), model() returns the model, and seed, data_seed, batch_size, accumulation and lr return
their default. autotune.trial.loop.script installs the trial's settings here before it runs the script, in
the same process. Importing this module imports nothing heavy: torch is imported inside the calls, once the
script has it loaded already.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.core.knobs.precision import DTYPE, SPELLINGS, VALUES

__all__ = ["accumulation", "autocast", "batch_size", "data_seed", "lr", "model", "scaler", "seed"]

# The torch dtype's name autocast is given for each precision (torch.bfloat16 is "bfloat16").
_DTYPE_NAMES = {p: dtype.removeprefix("torch.") for p, dtype in DTYPE.items()}


@dataclass
class Trial:
    """The settings of the trial running in this process, and what the script's calls did with them."""

    precision: str = "fp32"
    compile: str = "off"  # its mode, as the record of a model handed back compiled says it
    # The trial's model knobs at.model() routes (the knob list's whose ROUTE is "model", by their torch side):
    # `shaping` applied to the module handed over in place (its memory format), `wrapping` to what is handed
    # back (torch.compile); the identity where a knob is off.
    shaping: tuple[Callable[[Any], Any], ...] = ()
    wrapping: tuple[Callable[[Any], Any], ...] = ()
    seed: int = 0
    data_seed: int | None = None  # parity's data-order twin: the data order shifted by data_seed - seed
    device_type: str = "cpu"  # the machine's: until the script's model (or optimizer) says where it lives
    # The baseline: the script as written, so at.autocast() and at.scaler() run the script's own setting
    # (what they do outside a trial) whatever the config says.
    as_written: bool = False
    # The micro-batch and micro-batches per step the trial hands over; None: the script's own default.
    batch_size: int | None = None
    accumulation: int | None = None
    # The script's own micro-batch and accumulation as its source reads (the study's baseline), until
    # its calls hand over their defaults.
    own_batch_size: int | None = None
    own_accumulation: int = 1
    # The micro-batch reaches the script through its DataLoaders' batch_size (it calls no at.batch_size()):
    # the trial's seam hands it over there, as at.batch_size() would.
    through_loader: bool = False
    # The script's own option its DataLoader reads its batch from ("--batch-size"): the trial gives it on the
    # script's command line, so every line that reads the option (a view(args.batch_size, ...)) sees the
    # batch its DataLoader builds with, as the diff writes it (the option's default).
    batch_option: str | None = None
    # The factor the script's own arithmetic puts on its lr for (the batch given that option, its own batch),
    # where its lr reads the option (lr = base * args.batch_size / 256): the trial divides it out; None: it
    # does not read it.
    option_lr_scale: Callable[[int, int], float] | None = None
    # The factor on the script's own lr for the global batch the trial runs, given the script's own
    # (micro-batch, accumulation); None: the lr is the script's.
    lr_scale: Callable[[int, int], float] | None = None
    calls: dict[str, int] = field(default_factory=dict)
    # What each call was given and returned: the script's own defaults, read back into `applied`.
    defaults: dict[str, Any] = field(default_factory=dict)
    returned: dict[str, Any] = field(default_factory=dict)
    scalers: list[Any] = field(default_factory=list)
    models: list[Any] = field(default_factory=list)  # as at.model() got them (before compiling)
    handed_back: list[Any] = field(default_factory=list)  # as at.model() returned them
    optimizers: list[Any] = field(default_factory=list)  # the optimizers the script built (the trial's seam)
    # Called with each model at.model() gets, before it is compiled (the trial's observers hook it there).
    watch: Callable[[Any], None] | None = None
    # What at.autocast() ran, "bf16 on cpu" -> times, and the autocast the
    # script had entered itself around it (device type and dtype), when it had.
    autocasts: dict[str, int] = field(default_factory=dict)
    outer_autocast: dict[str, str] | None = None

    def called(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def handed(self, name: str, default: Any, value: Any) -> Any:
        """Record the script's own default and what the trial handed back for it (the first call's)."""
        self.called(name)
        self.defaults.setdefault(name, default)
        self.returned.setdefault(name, value)
        return value

    def option_words(self) -> list[str]:
        """What the trial adds to the script's command line: its batch option with the trial's batch, where
        the batch is handed over through it; [] otherwise."""
        if self.batch_option is None or self.batch_size is None or self.batch_size == self.own_batch_size:
            return []
        if self.batch_option.endswith("="):  # a configurator's joined `--batch_size=16`
            return [f"{self.batch_option}{self.batch_size}"]
        return [self.batch_option, str(self.batch_size)]

    def own(self) -> tuple[int, int] | None:
        """The script's own (micro-batch, accumulation): its calls' defaults, else what its source reads."""
        b = self.defaults.get("batch_size", self.own_batch_size)
        return None if b is None else (int(b), int(self.defaults.get("accumulation", self.own_accumulation)))

    def lr_factor(self) -> float:
        """The factor on the lr the script computes for this trial's global batch (1: its own batch): the
        study's rule from its own global batch, over what its own arithmetic put on it (own_option_factor)."""
        own = self.own()
        return 1.0 if own is None or self.lr_scale is None else self.lr_scale(*own) / self.own_option_factor()

    def own_option_factor(self) -> float:
        """What the script's own lr arithmetic put on its lr for the batch the trial gives its batch option (its
        lr reads the option: option_lr_scale); 1 where it reads none, or the option is not given."""
        own = self.own()
        if self.option_lr_scale is None or not self.option_words() or own is None or self.batch_size is None:
            return 1.0
        return self.option_lr_scale(self.batch_size, own[0])

    def tensor_device(self) -> Any:
        """Where the script's tensors live (a torch.device): the parameters of the model handed to
        at.model(), else of the first optimizer it built; None before either exists."""
        for m in self.models:
            p = next(m.parameters(), None) if hasattr(m, "parameters") else None
            if p is not None:
                return p.device
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    return p.device
        return None

    def tensor_device_type(self, given: str | None = None) -> str:
        """The device type autocast and GradScaler run on: where the script's tensors live, else the one
        the script names, else the machine's."""
        device = self.tensor_device()
        return device.type if device is not None else given or self.device_type


_trial: Trial | None = None
_model_outside: weakref.ref[Any] | None = None  # the model at.model() got outside a trial: its device


def install(trial: Trial | None) -> None:
    """Set (or, with None, clear) the trial this process runs: autotune.trial.loop.script's call only."""
    global _trial
    _trial = trial


def precision_of(own: Any) -> str:
    """A precision as a script gives it (None, "bf16", "bfloat16", torch.bfloat16, ...) as one of its VALUES."""
    if own is None:
        return "fp32"
    name = own if isinstance(own, str) else str(own).removeprefix("torch.")
    found = SPELLINGS.get(name.lower())
    if found is None:
        raise ValueError(f"at.autocast({own!r}): expected one of {', '.join(VALUES)} or a torch dtype")
    return found


def _outside_device(given: str | None) -> str:
    """The device type outside a trial: the one given, else where the model handed to at.model() lives,
    else CUDA when there is one."""
    import torch

    if given:
        return given
    m = _model_outside() if _model_outside is not None else None
    p = next(m.parameters(), None) if m is not None else None
    if p is not None:
        return str(p.device.type)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _autocast_at(device_type: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=getattr(torch, _DTYPE_NAMES[precision]))


def autocast(own: Any = None, device_type: str | None = None) -> contextlib.AbstractContextManager[Any]:
    """torch.autocast at the trial's precision, on the device the script's model lives on (fp32: none).

    own: the precision the script runs alone ("bf16", "fp16", "fp32"/None, or torch.bfloat16 ...): what this
    does outside a trial and in the baseline. device_type: where the script runs, for a script that hands
    no model to at.model() and builds its optimizer later; the model's own device wins.
    Inside an autocast the script entered itself, a trial's precision replaces it (an fp32 trial runs fp32
    here), and the trial records it; the baseline keeps it, as the script does alone."""
    precision = precision_of(own)
    t = _trial
    if t is None:
        return _autocast_at(_outside_device(device_type), precision)
    import torch

    t.called("autocast")
    t.defaults.setdefault("precision", precision)
    where = t.tensor_device_type(device_type)
    runs = precision if t.as_written else t.precision
    outer = torch.is_autocast_enabled(where)
    if outer and t.outer_autocast is None:
        t.outer_autocast = {"device_type": where, "dtype": str(torch.get_autocast_dtype(where)).removeprefix("torch.")}
    said = f"{runs} on {where}"
    t.autocasts[said] = t.autocasts.get(said, 0) + 1
    if outer and not t.as_written:
        # The script's own autocast around this one: the trial's precision here, fp32 included.
        dtype = getattr(torch, _DTYPE_NAMES[runs]) if runs != "fp32" else torch.get_autocast_dtype(where)
        return torch.autocast(where, dtype=dtype, enabled=runs != "fp32")
    return _autocast_at(where, runs)


def scaler(own: bool = False, device_type: str | None = None) -> Any:
    """A torch.amp.GradScaler, enabled only when the trial runs fp16 (disabled: every call passes through).

    own: the script's own GradScaler is enabled (it ran fp16 AMP): what this returns outside a trial and in
    the baseline."""
    import torch

    t = _trial
    if t is None:
        return torch.amp.GradScaler(_outside_device(device_type), enabled=bool(own))
    t.called("scaler")
    t.defaults.setdefault("scaler", bool(own))
    enabled = bool(own) if t.as_written else t.precision == "fp16"
    s = torch.amp.GradScaler(t.tensor_device_type(device_type), enabled=enabled)
    t.scalers.append(s)
    return s


def model(module: Any) -> Any:
    """The model with the trial's model knobs that at.model() routes applied (its memory format, compiled);
    outside a trial, the model as it is."""
    global _model_outside
    t = _trial
    if t is None:
        _model_outside = weakref.ref(module)  # the device at.autocast() and at.scaler() run on
        return module
    t.called("model")
    for shape in t.shaping:
        module = shape(module)
    t.models.append(module)
    if t.watch is not None:
        t.watch(module)
    for wrap in t.wrapping:
        module = wrap(module)
    t.handed_back.append(module)
    return module


def seed(default: int = 0) -> int:
    """The script's own seed, in a trial too: each trial, parity's two runs and `autotune run` start from the
    weights `python train.py` starts from (the call says the script seeds; it never changes the seed)."""
    t = _trial
    if t is not None:
        t.handed("seed", default, default)
    return default


def data_seed(default: int = 0) -> int:
    """The data-order seed a script that draws its batches itself (no DataLoader: a get_batch over a memmap)
    seeds its sampling with: the script's own `default`, except in parity's data-order twin, which shifts it
    (the config's data seed past its seed) so the twin draws other batches from the same initial weights."""
    t = _trial
    if t is None:
        return default
    shift = 0 if t.data_seed is None else t.data_seed - t.seed
    return int(t.handed("data_seed", default, default + shift))


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
