"""The Pipeline protocol: what autotune needs from a training workload, and nothing more.

autotune owns the loop and applies every knob around these three calls:

    model   = pipeline.build_model()            # an nn.Module on the CPU, fp32
    dataset = pipeline.build_dataset()          # items are (input, target) pairs
    loss    = pipeline.loss(model(x), target)   # a scalar tensor

Optional attributes:
    stages:      dotted names of submodules, in forward order, that activation checkpointing may wrap
    blocks:      dotted names of the repeated layers that parallel=fsdp shards one by one; default: stages
    unsupported: knob names this pipeline cannot honour (a token model has no memory layout to change)
    build_val_dataset() -> Dataset and metric(output, target) -> float: validation in `autotune train`
    validate_data(*, skip_bad, progress) -> str | None: check every item once, before the first trial
        (a DataError naming bad ones; with skip_bad, a note on what was dropped instead)
    model_key() -> picklable | None: build_model() depends only on this and torch's CPU generator (no
        knob, thread count or device), so a warm server may draw the model once for every trial
        (autotune.trial.loop.warm_model); None: build it in each trial

A dataset item that cannot be loaded should raise autotune.core.errors.DataItemError naming it; any
other exception from an item is reported as the data's fault too, naming its index.

A factory is named `module.path:callable`; it is called with the TrialConfig and returns a pipeline.
`lightning:module.path:callable` and `hf:module.path:callable` name a framework's job instead, run under
the framework's own Trainer (autotune.pipelines.frameworks); `script:PATH [ARGS...]` the user's own
training script, run as written (autotune.pipelines.script). Which of these a spec names is read once,
in `kind_of(spec)` (kind.py): the other layers ask that Kind what they need of the job instead of testing
the prefix; a framework job and a script, loaded, share the OwnLoopJob base (own_loop.py).
What is special about the built-in Unet (its default synthetic data, what a warm server preloads)
is answered here, so no other layer needs to know it.

May import: autotune.core (and torch, in the pipelines themselves).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from collections.abc import Callable, Mapping

from autotune.core.config import TrialConfig
from autotune.core.errors import PipelineError
from autotune.pipelines.kind import BUILTIN, Kind, kind_of

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

# Set (to "1") in a trial's environment under --skip-bad-data: a pipeline that validates its data then
# leaves out in the trial the items its up-front validate_data(skip_bad=True) dropped.
SKIP_BAD_DATA_ENV = "AUTOTUNE_SKIP_BAD_DATA"

__all__ = [
    "BUILTIN", "NO_BLOCKS", "SKIP_BAD_DATA_ENV", "Kind", "Pipeline", "Unsupported", "base_config", "blocks_of",
    "default_data", "is_regenerable", "kind_of", "load_pipeline", "own_baseline", "preload_modules", "resolve_factory",
    "skip_bad_data_in_trials", "stages_of", "unsupported_of", "validate_data",
]  # fmt: skip


@runtime_checkable
class Pipeline(Protocol):
    def build_model(self) -> torch.nn.Module: ...

    def build_dataset(self) -> Dataset[Any]: ...

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...


def resolve_factory(spec: str) -> Callable[..., Any]:
    """Import `module:callable` (or a built-in name); a clear PipelineError if it can't be done."""
    target = BUILTIN.get(spec, spec)
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise PipelineError(f"--pipeline {spec!r}: expected 'module.path:factory' or one of {', '.join(BUILTIN)}")
    # `python -m autotune` and trial processes see the working directory; the `autotune` script does not.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise PipelineError(f"--pipeline {spec!r}: cannot import {mod_name!r} ({e}); is it on PYTHONPATH?") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PipelineError(f"--pipeline {spec!r}: {mod_name} has no callable {attr!r}")
    return factory


def load_pipeline(cfg: TrialConfig) -> Pipeline:
    """The factory's pipeline (or framework job), checked; a baseline that sets a knob the pipeline
    cannot honour is bad input here, before any study or trial is made from it."""
    kind = kind_of(cfg.pipeline)
    if kind.loop == "trainer":
        from autotune.pipelines import frameworks  # lazy: a cycle, its own_loop.py imports this package

        pipeline: Any = frameworks.load(cfg)
    elif kind.loop == "script":
        from autotune.pipelines import script  # lazy: a cycle, it imports this package

        pipeline = script.load(cfg)
    else:
        pipeline = resolve_factory(cfg.pipeline)(cfg)
    if not isinstance(pipeline, Pipeline):
        raise PipelineError(
            f"--pipeline {cfg.pipeline!r} returned {type(pipeline).__name__}, expected an object with "
            "build_model(), build_dataset() and loss(output, target)"
        )
    _check_baseline(cfg, pipeline, unsupported_of(pipeline))
    return pipeline


def own_baseline(pipeline: Pipeline, global_batch: int | None = None) -> dict[str, Any]:
    """The baseline knobs a job that trains in its own loop says it runs with (OwnLoopJob.own_baseline: a
    Trainer's arguments, a script's own batch); {} for a Pipeline, whose baseline is plain PyTorch unless
    --baseline says otherwise. A batch that does not divide the study's --global-batch is left out: the
    baseline then picks one that does (baseline_of)."""
    from autotune.pipelines.own_loop import OwnLoopJob  # lazy: a cycle, own_loop.py imports this package

    knobs = pipeline.own_baseline(global_batch) if isinstance(pipeline, OwnLoopJob) else {}
    if global_batch and "batch_size" in knobs and global_batch % knobs["batch_size"]:
        del knobs["batch_size"]
    return knobs


def _check_baseline(cfg: TrialConfig, pipeline: Pipeline, unsupported: frozenset[str]) -> None:
    default, given = TrialConfig(), dict(cfg.baseline or ())
    refused = sorted(k for k in unsupported & set(given) if given[k] != getattr(default, k))
    if refused:  # a knob a job keeps is recorded at its own value (a script's kept batch)
        own = own_baseline(pipeline, cfg.global_batch)
        refused = [k for k in refused if given[k] != own.get(k)]
    values = getattr(unsupported, "values", {})
    if bad := sorted(k for k in set(values) & set(given) if given[k] in values[k]):
        raise PipelineError(
            f"--baseline sets {', '.join(f'{k} {given[k]}' for k in bad)}, which --pipeline {cfg.pipeline!r} cannot "
            "run (" + "; ".join(values[k][given[k]] for k in bad) + ")"
        )
    if refused:
        why = getattr(unsupported, "why", {})
        raise PipelineError(
            f"--baseline sets {', '.join(refused)}, which --pipeline {cfg.pipeline!r} cannot express"
            + "".join(f" ({why[k]})" for k in refused if k in why)
            + "; expected the default value or leave it out"
        )


def validate_data(
    pipeline: Pipeline, *, skip_bad: bool, progress: Callable[[int, int], None] | None = None
) -> str | None:
    """Check the pipeline's data up front, if it knows how (its optional validate_data). Raises
    DataError for bad items unless skip_bad; returns a one-line note for the caller to print, or None."""
    check = getattr(pipeline, "validate_data", None)
    if not callable(check):
        return None
    return check(skip_bad=skip_bad, progress=progress)


def stages_of(pipeline: Pipeline) -> tuple[str, ...]:
    return tuple(getattr(pipeline, "stages", ()) or ())


def stage_count(pipeline: Pipeline) -> int | None:
    """How many stages activation checkpointing may wrap; None where the pipeline finds them only as it runs (an
    unedited script's repeated blocks: trial 0 reports them, trial/loop/script/model.py)."""
    return None if getattr(pipeline, "stages", ()) is None else len(stages_of(pipeline))


def blocks_of(pipeline: Pipeline) -> tuple[str, ...]:
    """What parallel=fsdp shards one by one: the pipeline's `blocks`, else its checkpointing stages."""
    return tuple(getattr(pipeline, "blocks", ()) or ()) or stages_of(pipeline)


# Why a pipeline without blocks cannot take parallel=fsdp: FSDP sharding only the root would all-gather
# the whole model at once, no memory saved over DDP.
NO_BLOCKS = "fsdp shards per block, and the pipeline names neither `stages` nor `blocks`"


class Unsupported(frozenset):
    """Knob names a pipeline cannot honour, with why (`why[knob]`), for the note the search prints; and
    `values[knob]`: {value: why} for a knob it takes, but not at those values (fp16 for a script that hands
    over no GradScaler): the search drops them, a trial asked for one exits 5."""

    why: Mapping[str, str]
    values: Mapping[str, Mapping[Any, str]]

    def __new__(cls, reasons: Mapping[str, str], values: Mapping[str, Mapping[Any, str]] | None = None) -> Unsupported:
        self = super().__new__(cls, reasons)
        self.why = dict(reasons)
        self.values = {k: dict(v) for k, v in (values or {}).items()}
        return self


def unsupported_of(pipeline: Pipeline) -> frozenset[str]:
    """The knobs it cannot honour; a framework job's or a script's set also says why, per knob (`.why`).
    `parallel` is one of them for a pipeline with no blocks: it cannot run fsdp, its only value but the
    default."""
    given = getattr(pipeline, "unsupported", ()) or ()
    if "parallel" in given or blocks_of(pipeline):
        return given if isinstance(given, Unsupported) else frozenset(given)
    return Unsupported(
        {**{k: "" for k in given}, **getattr(given, "why", {}), "parallel": NO_BLOCKS}, getattr(given, "values", None)
    )


def default_data(spec: str, studies_dir: str | os.PathLike[str]) -> str | None:
    """The data a pipeline uses when no --data is given: the built-in Unet's deterministic synthetic
    set (generated once under studies_dir/data); None for a pipeline that brings its own."""
    if spec != "unet":
        return None
    from autotune.pipelines.unet.data import default_data as unet_default  # lazy: numpy and PIL

    return str(unet_default(studies_dir))


def is_regenerable(data_dir: str) -> bool:
    """A default synthetic set: identical on any machine, so a missing copy may be made afresh."""
    from autotune.pipelines.unet.data import SYNTHETIC_PREFIX  # lazy: numpy and PIL

    return Path(data_dir).name.startswith(SYNTHETIC_PREFIX)


def skip_bad_data_in_trials() -> None:
    """--skip-bad-data for every trial or training process started from here on (cold, forked from a warm
    server, or a torchrun rank): they inherit the environment. Call this rather than set the variable."""
    os.environ[SKIP_BAD_DATA_ENV] = "1"


def preload_modules(spec: str) -> tuple[str, ...]:
    """What a warm server imports for this pipeline: its heavy libraries and its own module."""
    return kind_of(spec).preload_modules()


def base_config(
    pipeline: str | None, image_size: int | None, data: str | None, studies_dir: str, /, **extra: Any
) -> TrialConfig:
    """The base config every trial of a run shares: --pipeline, --image-size and --data over `extra`
    (a config file's values, or the defaults); without any data, the pipeline's own default.
    Positional-only: a whole config file passed as `extra` has its own `pipeline` and `image_size`."""
    extra = {k: v for k, v in extra.items() if not (k in ("lr", "lr_scaling") and v is None)}  # None: not given
    cfg = TrialConfig(**extra)
    changes: dict[str, Any] = {}
    if pipeline:
        changes["pipeline"] = pipeline
    kind = kind_of(changes.get("pipeline", cfg.pipeline))
    changes["pipeline"] = kind.normalize()  # a script's path made absolute, the file checked
    # The lr, the rule its optimizer scales by and its own accumulation, read from the job's own source (a
    # script's) unless given.
    changes |= kind_of(changes["pipeline"]).study_defaults(
        cfg.global_batch, {k for k in ("lr", "lr_scaling", "own_accumulation", "keeps_accumulation") if k in extra}
    )
    if image_size:
        changes["image_size"] = image_size
    if data:
        changes["data_dir"] = str(Path(data).resolve())
    elif cfg.data_dir is None:
        default = default_data(pipeline or cfg.pipeline, studies_dir)
        if default is not None:
            changes["data_dir"] = default
    return cfg.replace(**changes)
