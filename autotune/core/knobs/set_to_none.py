"""set_to_none: `zero_grad(set_to_none=...)`: True frees the gradients between steps (the next backward
allocates them anew, and an optimizer skips a parameter with none), False zeroes them in place. torch's own
default since 2.0, so the baseline keeps it. Speed and memory only.

- Autotune's pipelines: their optimizer's zero_grad (apex's FusedAdam takes it at construction, as
  set_grad_none), its torch side trial/loop/knobs/set_to_none.py.
- An unedited script: every zero_grad() it calls, on an optimizer or a module, takes the trial's value, by its
  seam there (installed with the others: trial/loop/script/seams.py); the record is the last call's.
- The Trainers zero the gradients themselves: neither can take it (`NOT_IN`).
- The exports: the zero_grad call, written with the step it belongs to (apply/export/_step.py).

May import: the stdlib and the rest of autotune.core.
"""

from __future__ import annotations

from typing import Any

from autotune.core.knobs.row import Guided, knob

NAME = "set_to_none"
ROW = knob(True, "`zero_grad(set_to_none=...)`")
NOT_IN = {
    "lightning": "the LightningModule zeroes its own gradients (optimizer_zero_grad())",
    "hf": "the Trainer zeroes gradients itself (model.zero_grad(), which frees them)",
}


def guide(on: Guided) -> dict[str, Any]:
    """The guides' zero_grad: the gradients freed between steps."""
    return {NAME: True}
