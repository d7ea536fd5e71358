"""One row of the knob table and one rule of a knob's on a machine: the pure description a knob's module
(core/knobs/) declares, which its TrialConfig field takes.

May import: the stdlib.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


# Where an accelerate export puts what accelerate has no setting for.
IN_SCRIPT = "not an accelerate setting: in train.py (below)"


def knob(
    default: Any,
    sets: str,
    *,
    choices: tuple[str, ...] | None = None,
    needs: str | None = None,
    visit: int | None = None,
    math: str = "",
    memory: bool = False,
) -> Any:
    """Declare one tuned knob, as a TrialConfig field: everything else about it (KNOBS, CHOICES, the space's
    dependent knobs, the coordinate pass, the memory estimate's axes, `autotune knobs` and README's table) is
    read from here.

    sets: what it sets, in a user's words. choices: a string knob's values. needs: "workers", "processes" or
    "fsdp": it means something only then, and is left at its default otherwise. visit: its place in the
    coordinate pass (lowest first; None: left to TPE). math: what it can change in the training computed
    (empty: speed only), as core/training.py labels it. memory: it changes the memory estimate
    (search/space/memory.py); the others (loader, layout, compile...) are taken as not changing it."""
    meta = {"sets": sets, "choices": choices, "needs": needs, "visit": visit, "math": math, "memory": memory}
    return field(default=default, metadata={"knob": meta})


@dataclass(frozen=True)
class Knob:
    """One row of the knob table: a TrialConfig field declared with knob()."""

    name: str
    type: str
    default: Any
    sets: str
    choices: tuple[str, ...] | None
    needs: str | None
    visit: int | None
    math: str
    memory: bool


class Machine(Protocol):
    """What a knob's rules read of the machine (search/space/machine.py's Hardware)."""

    @property
    def cuda(self) -> bool: ...

    @property
    def cpu_bf16(self) -> bool: ...

    @property
    def cpu_count(self) -> int: ...

    @property
    def gpu_count(self) -> int: ...

    @property
    def apex(self) -> bool: ...


@dataclass(frozen=True)
class Guided:
    """What a knob's `guide` (the published guides' value for it: the warm start) reads of the machine."""

    cuda: bool
    bf16: bool  # the trial's devices compute bf16 natively (compute capability 8.0+, AVX512-BF16 or AMX)
    workers: int  # the usable CPUs shared by the trial's processes, as a worker count the space allows


@dataclass(frozen=True)
class Fix:
    """The knob fixed at `value` on this machine, and why."""

    value: Any
    why: str


@dataclass(frozen=True)
class Drop:
    """The knob's `values` dropped from the space on this machine, and why."""

    values: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class Clip:
    """The knob's range clipped to `high` on this machine, and why. strict: values above it are refused, not
    clipped."""

    high: int
    why: str
    strict: bool = False


Rule = Fix | Drop | Clip
