"""Apply each knob to a pipeline: the knobs' torch side. Every function returns what it really put in effect.

A model knob of the knob list (autotune/core/knobs/) has its torch side in the module of the same name here,
found by that name (`MODEL`, in the order the list applies them), and so has a process knob that is no flag
(the thread count); a process flag is set by the name of the torch attribute its module gives
(`setup_process`). The optimizer step's have theirs (optimizer_fusion.py: the optimizer autotune's pipelines
build, the pair set on a script's; set_to_none.py: zero_grad); the ranks' are applied below; the loader's in
trial/loop/loading.py, the strategy's in trial/loop/sharding.py.

Switches are built as no-ops where possible (GradScaler(enabled=...)), so the trial loop
has one shape whatever the config.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any
from collections.abc import Iterable

import torch
from torch import nn

from autotune.core import knobs as described
from autotune.core.config import TrialConfig
from autotune.core.effects import Seen, effects
from autotune.core.errors import ConfigError
from autotune.trial.loop.knobs.compile import COMPILE_BACKEND_ENV
from autotune.trial.loop.knobs.precision import DTYPES, Precision
from autotune.trial.measurement import observe

__all__ = ["COMPILE_BACKEND_ENV", "DTYPES", "Precision"]


def _torch_side(knob: ModuleType) -> ModuleType:
    return importlib.import_module(f"{__name__}.{knob.NAME}")


# Each model knob's torch side, by its name in the knob list, in the order they apply; the split at
# data-parallel, which the trial's replicate (or DDP) goes between.
BEFORE_PARALLEL = tuple(map(_torch_side, described.BEFORE_PARALLEL))
AFTER_PARALLEL = tuple(map(_torch_side, described.AFTER_PARALLEL))
MODEL = BEFORE_PARALLEL + AFTER_PARALLEL
# Each process knob's torch side that is no flag (the thread count), by its name in the list.
SET_UP = {k.NAME: _torch_side(k) for k in described.PROCESS if k not in described.FLAGS}


def on_stages(model: nn.Module, stages: Iterable[str], cfg: TrialConfig) -> dict[str, Any]:
    """Autotune's pipelines: the model knobs applied to the stages a pipeline declares (checkpointing)."""
    applied: dict[str, Any] = {}
    for knob in MODEL:
        if (apply := getattr(knob, "on_stages", None)) is not None:
            applied |= apply(model, list(stages), cfg)
    return applied


def refuse_past_stages(cfg: TrialConfig, stages: tuple[str, ...]) -> None:
    """A job that applies the stages itself (a Trainer's): a knob asking for more than it declares is exit 5."""
    for knob in MODEL:
        if (refuse := getattr(knob, "refuse_past", None)) is not None:
            refuse(cfg, stages)


def wrapper_prefixes(model: nn.Module) -> list[str]:
    """The state-dict prefixes the model knobs' wrappers add ("stage.inner."): the pipeline's own names less them."""
    return [p for knob in MODEL for p in getattr(knob, "wrapper_prefixes", lambda m: [])(model)]


def routed_through(call: str, among: tuple[ModuleType, ...] = MODEL) -> tuple[ModuleType, ...]:
    """The torch side of the model knobs a script routes through at.`call`() itself, in the list's order."""
    return tuple(k for k in among if described.BY_NAME[k.NAME].ROUTE == call)


def handed_records(trial: Any) -> dict[str, Any]:
    """What the model knobs a script hands over through its at.* calls record of them (`handed_record`: what
    at.autocast() entered, whether at.scaler()'s GradScaler scaled), in the list's order."""
    return {k: v for knob in MODEL for k, v in getattr(knob, "handed_record", lambda t: {})(trial).items()}


def setup_process(cfg: TrialConfig, device: torch.device) -> dict[str, Any]:
    """The process knobs of the list, in its order, set before the job runs: a flag by the torch attributes its
    module names (`sets`), the others by their torch side (`set_up`: the thread count); then read back
    (process_seen)."""
    for knob in described.PROCESS:
        if knob.NAME in SET_UP:
            SET_UP[knob.NAME].set_up(cfg)
            continue
        for path, setting in knob.sets(getattr(cfg, knob.NAME)).items():
            set_flag(path, setting)
    seen = process_seen(cfg, device)
    return effects(cfg, seen)


def process_seen(cfg: TrialConfig, device: torch.device) -> Seen:
    """The process knobs as in effect now, each with why: a flag by the torch attribute its module reads
    (`SEEN`), in effect only on CUDA, where what it switches runs; the others by their torch side (`seen`).
    Read once the job is set up, and again after a script ran, which may set them itself."""
    cuda = device.type == "cuda"
    seen: Seen = {}
    for knob in described.PROCESS:
        if knob.NAME in SET_UP:
            seen[knob.NAME] = SET_UP[knob.NAME].seen(cfg)
            continue
        value = getattr(cfg, knob.NAME)
        seen[knob.NAME] = (bool(observe.torch_flag(knob.SEEN)) and cuda, knob.NO_CUDA if value and not cuda else "")
    return seen


def set_flag(path: str, value: Any) -> None:
    owner, _, attr = path.rpartition(".")
    setattr(observe.torch_flag(owner), attr, value)


def prepare_model(
    model: nn.Module, cfg: TrialConfig, device: torch.device, world: int
) -> tuple[nn.Module, dict[str, Any]]:
    seen: Seen = {}
    model = model.to(device)
    for knob in BEFORE_PARALLEL:
        if (to_model := getattr(knob, "to_model", None)) is not None:  # the rest apply in the loop or by stage
            model = to_model(model, cfg)
            seen[knob.NAME] = knob.ran(model, cfg)
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    seen["gpus"] = (world, _ddp_why(world, device))
    for knob in AFTER_PARALLEL:
        if (to_model := getattr(knob, "to_model", None)) is not None:  # the rest apply in the loop or by stage
            model = to_model(model, cfg)
            seen[knob.NAME] = knob.ran(model, cfg)
    return model, effects(cfg, seen)


def _ddp_why(world: int, device: torch.device) -> str:
    if world == 1:
        return ""
    if device.type != "cuda":
        return f"{world} CPU processes over gloo"
    if ddp_backend(device) == "gloo":
        return f"{world} processes over gloo ({DDP_BACKEND_ENV}), rank r on GPU r mod {torch.cuda.device_count()}"
    return ""


def no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP's no_sync() for an accumulating micro-step (not the last): its gradients stay local, and the
    last micro-step's backward all-reduces the sum. A no-op without DDP."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile wraps DDP
    if last or not isinstance(inner, nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return inner.no_sync()


def to_device(t: torch.Tensor, device: torch.device, cfg: TrialConfig) -> torch.Tensor:
    """A batch's tensor on the device, in the format the model knobs give it."""
    for knob in MODEL:
        if (move := getattr(knob, "to_input", None)) is not None:
            return move(t, device, cfg)
    return t.to(device, non_blocking=cfg.pin_memory)


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) as torchrun sets them; (0, 1, 0) for a plain process."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


# "gloo": DDP over gloo, which carries CUDA tensors for DDP's broadcast and all-reduce, so ranks may share
# a GPU (NCCL refuses two ranks on one device): every DDP path runs on CUDA on a one-GPU machine. Its
# speed means nothing; its correctness does. "nccl": the default on CUDA, named. Unset: nccl on CUDA,
# gloo on CPU.
DDP_BACKEND_ENV = "AUTOTUNE_DDP_BACKEND"
DDP_BACKENDS = ("gloo", "nccl")


def ddp_backend(device: torch.device) -> str:
    chosen = os.environ.get(DDP_BACKEND_ENV, "").strip().lower()
    if not chosen:
        return "nccl" if device.type == "cuda" else "gloo"
    if chosen not in DDP_BACKENDS:
        raise ConfigError(f"{DDP_BACKEND_ENV}={chosen!r}: expected one of {', '.join(DDP_BACKENDS)}")
    if chosen == "nccl" and device.type != "cuda":
        raise ConfigError(f"{DDP_BACKEND_ENV}=nccl needs CUDA; this process runs on {device}")
    return chosen


def ranks_share_gpus() -> bool:
    """Several ranks on one GPU, as AUTOTUNE_DDP_BACKEND=gloo allows: rank r takes GPU r mod count."""
    return os.environ.get(DDP_BACKEND_ENV, "").strip().lower() == "gloo"


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count() if ranks_share_gpus() else local_rank
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
