"""The initial model a warm server draws once and each of its forked trials reuses.

Drawing a model's initial weights, one value at a time on torch's CPU generator, is most of a forked
trial's start-up. A pipeline may say that its model is the same for every trial that shares a key: its
class has a `model_key()` method returning a picklable value (None: not this time) such that
build_model() depends on nothing but that key and the state of torch's CPU generator (not on any knob,
the thread count or the device). For the first request of a (pipeline, seed, rank) the server forks a
builder (see warm_server) that makes the pipeline as harness.build does, draws the model and saves it
with the generator states around the draw; the server maps the file (copy-on-write, so each forked
trial trains its own copy of the pages) and every later child starts with it in PREBUILT.

A trial takes the prebuilt model only where a cold build would draw the same weights: the same
pipeline, an equal key, and the generator in the very state the builder drew from (which carries the
seed, the rank and whatever the pipeline drew while being made). It then sets the generator to the state
the draw left, so every later draw (the data order, dropout) is what a cold build would have produced.
Anything else builds the model as it always does.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from autotune.core.config import TrialConfig
    from autotune.pipelines import Pipeline

MODEL_KEY = "model_key"  # the optional Pipeline method
NOT_REUSABLE = 3  # a builder's exit code: the pipeline gave no key, or its build touched CUDA
# Printed to the trial's log when it starts from the server's model instead of drawing its own.
REUSED = "autotune trial: initial weights drawn once by the warm server (same pipeline, key and seed state)"


@dataclass
class Prebuilt:
    """A model as the builder drew it, and what must match for a trial to take it."""

    spec: str  # cfg.pipeline
    key: Any  # the pipeline's model_key()
    dtype: str  # torch's default dtype while drawing
    before: torch.Tensor  # the CPU generator's state the draw started from ...
    after: torch.Tensor  # ... and the one it left
    numpy: tuple[Any, Any] | None  # numpy's global states before and after, where the build drew from it
    python: tuple[Any, Any] | None  # the same for `random`
    model: nn.Module


# In the server: the models loaded so far. A forked child has its own copy and takes from it.
PREBUILT: list[Prebuilt] = []


def model_key(pipeline: Any) -> Any | None:
    get = getattr(pipeline, MODEL_KEY, None)
    return get() if callable(get) else None


def seeded_pipeline(cfg: TrialConfig, rank: int) -> Pipeline:
    """The config's pipeline, made just after torch is seeded from cfg.seed: the generator state its
    model is drawn from. One function, because a warm server's builder must reach the very state a
    trial's harness.build does."""
    import torch

    from autotune.pipelines import load_pipeline

    torch.manual_seed(cfg.seed + rank)
    return load_pipeline(cfg)


def build_model(pipeline: Pipeline, cfg: TrialConfig) -> nn.Module:
    """pipeline.build_model(), or the warm server's model where it is the same one, with every
    generator left as the build would have left it."""
    entry = _match(cfg.pipeline, pipeline) if any(e.spec == cfg.pipeline for e in PREBUILT) else None
    if entry is None:
        return pipeline.build_model()
    PREBUILT.remove(entry)  # the trial trains it in place: a second build in this process draws its own
    _restore(entry)
    print(REUSED, flush=True)
    return entry.model


def _match(spec: str, pipeline: Pipeline) -> Prebuilt | None:
    import numpy as np
    import torch

    try:
        key = model_key(pipeline)
    except Exception:  # noqa: BLE001 - a cold trial never asks: a key that fails only means "draw it"
        return None
    if key is None:
        return None
    state = torch.get_rng_state()
    for e in PREBUILT:
        if (
            e.spec == spec
            and e.key == key
            and e.dtype == str(torch.get_default_dtype())
            and torch.equal(state, e.before)
            and (e.numpy is None or _same_numpy_state(np.random.get_state(), e.numpy[0]))
            and (e.python is None or random.getstate() == e.python[0])
        ):
            return e
    return None


def _restore(entry: Prebuilt) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(entry.after)
    if entry.numpy is not None:
        np.random.set_state(entry.numpy[1])
    if entry.python is not None:
        random.setstate(entry.python[1])


def _same_numpy_state(a: Any, b: Any) -> bool:
    import numpy as np

    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b, strict=True))


def _drew(before: Any, after: Any, same: Any) -> tuple[Any, Any] | None:
    return None if same(before, after) else (before, after)


# --- in the server and its builder ----------------------------------------------------------------


def wanted(argv: list[str], env: dict[str, str]) -> tuple[str, int, int] | None:
    """The (pipeline, seed, rank) a builder would draw the model of for this trial request, or None
    where nothing could be reused: the pipeline's class has no model_key, or the server has not
    imported it (a builder would import it, and the server's children after it), or the request's
    config can't be read (the trial reports that itself)."""
    from autotune.core.configfile import load_config

    try:
        cfg = load_config(_config_path(argv))
        rank = int(env.get("RANK", "0"))
    except Exception:  # noqa: BLE001 - the trial will say what is wrong with its config
        return None
    return (cfg.pipeline, cfg.seed, rank) if _declares(cfg.pipeline) else None


def _declares(spec: str) -> bool:
    from autotune.pipelines import kind_of

    kind = kind_of(spec)
    if not kind.can_draw_model_once:  # its model is built inside its own loop
        return False
    module, _, attr = (kind.factory or "").partition(":")
    factory = getattr(sys.modules.get(module), attr, None)
    return callable(getattr(factory, MODEL_KEY, None))


def build_entry(argv: list[str], out: str) -> int:
    """In a builder (a child of the server, set up as a trial would be): make the pipeline for the
    trial `argv` asks for exactly as harness.build does, draw its model, and save it to `out` with
    the generator states around the draw. 0 when saved, else NOT_REUSABLE."""
    import numpy as np
    import torch

    from autotune.core.configfile import load_config

    cfg = load_config(_config_path(argv))
    pipeline = seeded_pipeline(cfg, int(os.environ.get("RANK", "0")))
    key = model_key(pipeline)
    if key is None:
        return NOT_REUSABLE
    before = torch.get_rng_state(), np.random.get_state(), random.getstate()
    model = pipeline.build_model()
    after = torch.get_rng_state(), np.random.get_state(), random.getstate()
    if torch.cuda.is_initialized():  # drawn (partly) on a GPU: not what a CPU copy could give back
        return NOT_REUSABLE
    entry = Prebuilt(
        spec=cfg.pipeline,
        key=key,
        dtype=str(torch.get_default_dtype()),
        before=before[0],
        after=after[0],
        numpy=_drew(before[1], after[1], _same_numpy_state),
        python=_drew(before[2], after[2], lambda a, b: a == b),
        model=model,
    )
    torch.save(entry, out + ".part")
    os.replace(out + ".part", out)
    return 0


def load(path: str) -> None:
    """Map a builder's file into this (the server's) process, for every child forked from now on.
    Mapped privately: a child that trains the model copies the pages it writes; the file stays as drawn."""
    import torch

    PREBUILT.append(torch.load(path, map_location="cpu", weights_only=False, mmap=True))


def _config_path(argv: list[str]) -> str:
    """The worker's --config (as launcher.command writes it, or as --config=PATH)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    raise ValueError("the request has no --config")
