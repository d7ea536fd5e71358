"""A job that trains in its own loop: a framework's Trainer job or a user's script, checked and loaded.

What the search needs to know of such a job, shared by both kinds: its spec, the knobs it cannot take
(with why, for the note the search prints), its checkpointing stages, and the knobs its own settings say
(`own_baseline`, trial 0's baseline when no --baseline is given). autotune builds none of its parts, so
build_model, build_dataset and loss say why in the kind's own words (`not_built`) instead: `autotune
train` and the memory probe reach them only through a Pipeline-shaped call.

May import: autotune.core, autotune.pipelines.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, NoReturn

from autotune.core.errors import PipelineError
from autotune.pipelines import Unsupported


class OwnLoopJob(ABC):
    """A checked job whose loop is its own (see the module): not a Pipeline, though shaped like one so that
    load_pipeline hands every kind back alike."""

    def __init__(self, spec: str, unsupported: Mapping[str, str], stages: tuple[str, ...] | None = ()) -> None:
        """stages: what activation checkpointing wraps; None: found only as the job runs (stage_count)."""
        self.spec, self.stages = spec, stages
        self.unsupported = Unsupported(unsupported)

    @abstractmethod
    def own_baseline(self, global_batch: int | None = None) -> dict[str, Any]:
        """The knobs the job runs with as written, where they differ from a config's defaults; global_batch:
        the study's, which a job's own accumulation may need."""

    @abstractmethod
    def not_built(self) -> str:
        """Why autotune cannot build the job's parts apart, and what to run instead."""

    def _refuse(self) -> NoReturn:
        raise PipelineError(self.not_built())

    def build_model(self) -> Any:
        self._refuse()

    def build_dataset(self) -> Any:
        self._refuse()

    def loss(self, output: Any, target: Any) -> Any:
        self._refuse()
