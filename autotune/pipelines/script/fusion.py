"""Whether optimizer_fusion can reach a script's optimizer: the `fused`/`foreach` flags its constructor
accepts, read from the class the source constructs (torch.optim's, by name) with inspect.signature.

The trial sets an optimizer's flags only where its param groups carry both (autotune.trial.loop.script), and
the diff export writes them on the same classes; an optimizer without the pair (Adadelta, RMSprop and
Adamax take foreach alone, LBFGS neither) runs its own implementation whatever the config says, so the
knob is fixed for that script with the reason rather than searched and recorded "in effect none". A
class torch.optim does not have (Lion from another package, apex's FusedAdam) cannot be read without
importing its package: the knob stays searched and the trial records what it did. Signatures, not a
list of names, so a torch release that adds `fused` to a class makes the knob searchable there.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

FLAGS = ("fused", "foreach")


def flags_of(name: str) -> frozenset[str] | None:
    """The fusion flags `torch.optim.<name>`'s constructor accepts; None: torch.optim has no such class."""
    try:
        import torch.optim
    except ImportError:  # no torch here (a search host without it): nothing to read
        return None
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        return None
    params = inspect.signature(cls.__init__).parameters
    return frozenset(f for f in FLAGS if f in params)


def unroutable(optimizers: Sequence[str]) -> str | None:
    """Why optimizer_fusion cannot reach any optimizer the script constructs, or None: one takes the
    fused/foreach pair, one cannot be read (not torch.optim's), or the source names none."""
    read = {name: flags_of(name) for name in optimizers}
    if not read or any(flags is None or set(FLAGS) <= flags for flags in read.values()):
        return None
    said = "; ".join(f"torch.optim.{name} takes {_takes(flags)}" for name, flags in read.items() if flags is not None)
    return (
        f"the script's optimizer has no fused/foreach pair ({said}): the trial sets an optimizer's fused "
        "and foreach flags together, so every value would run its own implementation"
    )


def _takes(flags: frozenset[str]) -> str:
    if not flags:
        return "neither fused nor foreach"
    (only,) = flags
    other = "foreach" if only == "fused" else "fused"
    return f"{only} but not {other}"
