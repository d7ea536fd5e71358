"""The knob list: one module a knob, each holding its whole story as pure description, and the ordered lists
the trial, the diff, the alone copy and `autotune run` read, so no order or wording is copied by hand.

A knob's module holds:
  - its row (`ROW`: its TrialConfig field: default, values, what it sets, the training math it changes);
  - its space rules: `machine(hw)` (fixed or dropped on this machine, and why), `model_why(facts)` (a script's
    model that cannot take it, from trial 0's facts), `NOT_IN` (the Trainers that cannot express it); and
    `guide(on)`, the published guides' value for it on this machine (the search's warm start, `guides`);
  - how it reaches an unedited script: `ROUTE` (the at.* call a script routes it through itself), `HOW` (what
    the trial does with no edit), `sets(value)` (a process flag, set by name before the job runs, `SEEN` read
    back after); a knob whose value a script gives its at.* call, as `SPELLINGS` allow, has its rules there:
    `script_own(said)`, `script_why(own, calls)`, `script_refused(own, calls)` (pipelines/script/ reads them);
  - its Trainers' terms, both ways: `hf_fields`/`lightning_fields` (what a trial sets over the user's
    TrainingArguments or Trainer arguments, and the exports write), `hf_own`/`lightning_own` (the user's own,
    read back for trial 0), joined by `merged` and `own`;
  - the lines every export writes for it: `LINES` (the diff's plain torch after the optimizer's statement,
    `line_fields` filling them), `api_lines`, `at_model`, `row`, and each target's `lightning_*`, `hf_*`,
    `accelerate_*`, `script_lines` (apply/export/_compute.py joins them in this list's order), and
    `framework_notes` (beside a framework study's own Trainer arguments: what they cannot hold), and
    `script_notes` (the diff's words for what no line of a script can say: gpus's replicate).
Its torch side, applied by name where the layers allow torch, is the module of the same name in
autotune/trial/loop/knobs/ (a model knob: how it is applied to a model, in place, and what it observes; the
thread count: set and read back; the optimizer's implementation: the optimizer built, a script's pair set); a
process flag needs none.

The DataLoader's four knobs share one module (`loader`), and so do the strategy's five (`strategy`: parallel
and FSDP's sub-knobs): each group is one call's arguments with rules between them, outside the lists below,
which hold one knob a module.

To add a knob: its module here, its line in the list below, its TrialConfig field (`name: type = listed.name.ROW`,
the one line the type checker needs), and, for a model knob, its torch module in trial/loop/knobs/.

May import: the stdlib and the rest of autotune.core.
"""

from __future__ import annotations

from collections.abc import Collection
from types import ModuleType
from typing import Any

from autotune.core.knobs import (
    batch_size,
    channels_last,
    checkpoint_segments,
    compile,
    cudnn_benchmark,
    gpus,
    loader as loader,  # the DataLoader's four knobs: one module, outside the one-knob lists
    num_threads,
    optimizer_fusion,
    precision,
    set_to_none,
    strategy as strategy,  # parallel and FSDP's sub-knobs: one module, outside the one-knob lists
    tf32,
)
from autotune.core.knobs.row import Guided

# The model knobs, in the order they apply to a model (torchtitan's): checkpointing, the memory format, then
# data-parallel (the trial's own, where it replicates the model: its buckets view the weights in their final
# format, and its hooks run before autocast's), autocast, compile last (of the forward, around which the
# others' hooks run eagerly).
BEFORE_PARALLEL: tuple[ModuleType, ...] = (checkpoint_segments, channels_last)
AFTER_PARALLEL: tuple[ModuleType, ...] = (precision, compile)
MODEL = BEFORE_PARALLEL + AFTER_PARALLEL
# What the process takes before the job runs: the flags (torch attributes, set and read back by name), the
# thread count.
FLAGS: tuple[ModuleType, ...] = (cudnn_benchmark, tf32)
PROCESS: tuple[ModuleType, ...] = FLAGS + (num_threads,)
# The optimizer step's: its batch, its implementation, its zero_grad.
STEP: tuple[ModuleType, ...] = (batch_size, optimizer_fusion, set_to_none)
# The processes the trial runs.
RANKS: tuple[ModuleType, ...] = (gpus,)
ALL: tuple[ModuleType, ...] = PROCESS + MODEL + STEP + RANKS
BY_NAME: dict[str, ModuleType] = {k.NAME: k for k in ALL}
MODEL_NAMES = tuple(k.NAME for k in MODEL)


def each(part: str, *args: Any, among: tuple[ModuleType, ...] = ALL) -> list[Any]:
    """Every knob's `part` (a function returning lines), in the list's order, joined: the knobs without one
    add nothing."""
    return [line for k in among if (fn := getattr(k, part, None)) for line in fn(*args)]


def merged(part: str, *args: Any, skip: Collection[str] = ()) -> dict[str, Any]:
    """Every knob's `part` (a function returning a framework's fields), merged in the list's order: the knobs
    without one, or in `skip` (the framework cannot express them), add nothing."""
    return {f: v for k in ALL if k.NAME not in skip and (fn := getattr(k, part, None)) for f, v in fn(*args).items()}


def guides(on: Guided) -> dict[str, Any]:
    """The published guides' value of every knob that has one, on this machine: the search's warm start."""
    return merged("guide", on) | loader.guide(on)


def fields(part: str, *args: Any) -> dict[str, tuple[str, ...]]:
    """Each knob's fields in a framework's terms, as its `part` (hf_fields, lightning_fields) names them."""
    return {k.NAME: tuple(fn(*args)) for k in ALL if (fn := getattr(k, part, None))}


def own(part: str, *args: Any) -> dict[str, Any]:
    """Each knob's own value as its `part` reads it from a job's arguments, by name (None: not said there)."""
    return {k.NAME: v for k in ALL if (fn := getattr(k, part, None)) and (v := fn(*args)) is not None}


def routed_by(call: str) -> tuple[str, ...]:
    """The model knobs a script routes through at.`call`() itself."""
    return tuple(k.NAME for k in MODEL if k.ROUTE == call)


def not_in(target: str) -> dict[str, str]:
    """The knobs a Trainer (lightning, hf) cannot express, and why."""
    return {k.NAME: k.NOT_IN[target] for k in ALL if target in getattr(k, "NOT_IN", {})}
