"""Framework pipelines: a Lightning module or a transformers Trainer job, tuned under its own loop.

`--pipeline lightning:MODULE:FACTORY` names a factory returning (LightningModule, LightningDataModule),
optionally with the keyword arguments of the user's own Trainer as a third item;
`--pipeline hf:MODULE:FACTORY` one returning (model, train_dataset, data_collator, TrainingArguments).
The factory is called with the TrialConfig, like any pipeline factory. A trial then runs the framework's
own loop (Trainer.fit, Trainer.train) with the knobs mapped onto its arguments, measured by a callback
(autotune.trial.loop.frameworks). This package owns what needs no trial: the spec, the factory's output
checked, which knob maps to which argument, and why a knob cannot be expressed (`unsupported`, with
a reason per knob, which the search fixes to its default and says).

The frameworks are imported only when such a pipeline is named, so autotune runs without them.
May import: autotune.core (and the frameworks, lazily).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping

from autotune.core.config import LEADS, dependents
from autotune.core.errors import PipelineError
from autotune.pipelines.kind import kind_of
from autotune.pipelines.own_loop import OwnLoopJob

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

# Kind.framework -> (the module checked and used, what to install). lightning.pytorch, not pytorch_lightning:
# the two packages define distinct classes, and a trial must build the Trainer of the module's package.
LIBRARIES = {
    "lightning": ("lightning.pytorch", "pip install 'autotune[frameworks]'"),
    "hf": ("transformers", "pip install 'autotune[frameworks]'"),
}
EXPECTED = {
    "lightning": "(LightningModule, LightningDataModule[, trainer_kwargs])",
    "hf": "(model, train_dataset, data_collator, TrainingArguments)",
}


def library_module(spec: str) -> Any:
    """The framework's module, imported now; a missing library is bad input, said in one line."""
    name, install = LIBRARIES[kind_of(spec).framework or ""]
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise PipelineError(f"--pipeline {spec!r} needs {name}, which cannot be imported ({e}); {install}") from None


# The strategy knobs: autotune runs a framework's Trainer with the Trainer's own DDP; handing it FSDP (and
# FSDP's sub-knobs) is not wired, so a search keeps them at their defaults and says why.
STRATEGY = {
    k: "autotune runs the Trainer with its own DDP strategy; fsdp is searched in autotune's own loop only"
    for k in (LEADS["fsdp"], *dependents("fsdp"))
}


class FrameworkJob(OwnLoopJob):
    """What the factory returned (`parts`), checked, under the framework `library` ("lightning", "hf"):
    the user's own objects, which a trial hands to that framework's Trainer."""

    @property
    def library(self) -> str:
        """The framework whose Trainer runs the job, as the spec's Kind names it (Kind.framework)."""
        return kind_of(self.spec).framework or ""

    def __init__(
        self, spec: str, parts: tuple[Any, ...], unsupported: Mapping[str, str], stages: tuple[str, ...] = ()
    ) -> None:
        super().__init__(spec, unsupported, stages)
        self.parts = parts

    def not_built(self) -> str:
        return (
            f"--pipeline {self.spec!r} trains under {self.library}'s own Trainer: `autotune train` "
            f"cannot run it; apply the tuned settings (autotune export --format {self.library})"
        )


def load(cfg: TrialConfig) -> FrameworkJob:
    """Import the framework and the factory, call it with `cfg`, and check what it returned."""
    from autotune.pipelines import resolve_factory

    kind = kind_of(cfg.pipeline)
    target, framework = kind.factory, kind.framework
    assert target is not None and framework is not None, "a framework's spec names its framework and factory"
    library = library_module(cfg.pipeline)
    try:
        factory = resolve_factory(target)
    except PipelineError as e:  # its message names the part after the prefix: name what the user wrote
        raise PipelineError(str(e).replace(repr(target), repr(cfg.pipeline), 1)) from None
    returned = factory(cfg)
    if framework == "lightning":
        from autotune.pipelines.frameworks import lightning as adapter
    else:
        from autotune.pipelines.frameworks import hf as adapter  # type: ignore[no-redef]
    job = adapter.check(cfg.pipeline, library, returned)
    if job is None:
        raise PipelineError(
            f"--pipeline {cfg.pipeline!r} returned {describe(returned)}, expected {EXPECTED[framework]}"
        )
    return job


def describe(value: Any) -> str:
    """A factory's return value in a few words: `tuple (Net, list)`, `int`."""
    if isinstance(value, tuple):
        return f"tuple ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


def threads(cfg: TrialConfig) -> dict[str, int]:
    """num_threads in a framework record: it is neither a Trainer argument nor a TrainingArguments field
    (the export makes it a torch.set_num_threads line), so best.yaml's framework: section names it too."""
    return {"num_threads": cfg.num_threads} if cfg.num_threads else {}
