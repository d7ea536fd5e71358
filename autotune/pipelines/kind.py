"""The kind of job a pipeline spec names, as one object: what the search, a trial and the export ask of it.

A spec is one of four kinds:

    name        spec                     whose loop a trial measures
    pipeline    MODULE:FACTORY | unet    autotune's own, over a Pipeline (build_model, build_dataset, loss)
    lightning   lightning:MODULE:FACTORY the Lightning Trainer's, through a callback
    hf          hf:MODULE:FACTORY        the transformers Trainer's, through a callback
    script      script:PATH [ARGS...]    the user's script's, run as written, through torch's own seams

`kind_of(spec)` reads the prefix once, here; every other layer asks the Kind what it needs (whose loop
runs, whether the model can be built apart for a probe, a ceiling or a warm draw, whether the search ends
with alone rounds, learns from trial 0, or the export has `autotune run`, which framework's Trainer runs
it, which export formats render the job, what a warm server preloads, the command that runs the job alone)
by a capability's name instead of testing the kind or the prefix itself. What depends on the job's
contents, not its kind (the knobs it cannot take, its own baseline), is the loaded job's: `load_pipeline`
and `unsupported_of`.

May import: autotune.core, autotune.pipelines (its kinds' packages, lazily).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from autotune.core.config import TrialConfig

Loop = Literal["autotune", "trainer", "script"]

SCRIPT_PREFIX = "script:"
# Built-in pipelines by short name: the factory each one imports.
BUILTIN = {"unet": "autotune.pipelines.unet.pipeline:UnetPipeline"}
# What a warm server imports for a built-in besides its module (unet.data: UnetPipeline(cfg) imports it to
# list the data folder, in every trial).
_BUILTIN_PRELOAD = {"unet": ("torchvision", "segmentation_models_pytorch", "autotune.pipelines.unet.data")}
# A framework's own library, imported once by a warm server so forked trials start with it (transformers
# imports its Trainer lazily).
_FRAMEWORK_PRELOAD = {"lightning": ("lightning.pytorch",), "hf": ("transformers", "transformers.trainer")}
# A script itself runs in the trial, never imported ahead: only what its DataLoader workers import.
_SCRIPT_PRELOAD = ("torch.utils.data",)


@dataclass(frozen=True)
class Kind:
    """A spec's kind, bound to the spec. Ask it what the job can do by a capability's name, not which kind it
    is; the spec rides along so that the questions that need it (normalize, alone_command, preload_modules)
    take no argument."""

    name: Literal["pipeline", "lightning", "hf", "script"]
    spec: str
    loop: Loop  # whose loop a trial measures: autotune's own, a framework Trainer's, or the script's
    noun: str  # the kind in a sentence: "a framework pipeline trains in its own loop"
    exports: tuple[str, ...]  # the export formats (besides yaml) that render this kind's study in its terms

    @property
    def builds_model_apart(self) -> bool:
        """autotune can build the job's model and data apart from a run (Pipeline.build_model): what the memory
        probe, the ceiling's compute-only step, a warm server's model draw and `autotune train` need."""
        return self.loop == "autotune"

    @property
    def can_probe_memory(self) -> bool:
        """The memory probe can build the model and run one forward (see builds_model_apart)."""
        return self.builds_model_apart

    @property
    def can_draw_model_once(self) -> bool:
        """A warm server may draw the model once for every trial, if the pipeline also declares model_key()
        (autotune.trial.loop.warm_model): the trial builds it through the factory, not inside its own loop."""
        return self.builds_model_apart

    @property
    def why_no_ceiling(self) -> str | None:
        """Why the data-bound ceiling cannot be measured for this kind (its compute-only step is autotune's
        own h.step), or None: it can."""
        return (
            None
            if self.builds_model_apart
            else f"{self.noun} trains in its own loop; the compute-only step needs autotune's own loop, "
            "which steps the model on a few cached batches"
        )

    @property
    def runs_alone(self) -> bool:
        """A script's figure is its user's, `python train.py ARGS` run alone: its search ends with alone rounds."""
        return self.loop == "script"

    @property
    def learns_from_trial0(self) -> bool:
        """Trial 0 runs a script as written and records what its source could not say (its batch, its loaders)."""
        return self.loop == "script"

    @property
    def has_run_command(self) -> bool:
        """Only a script trains under a trial's seams with no edit: `autotune run` applies best.yaml to it."""
        return self.loop == "script"

    @property
    def framework(self) -> str | None:
        """The library whose Trainer runs the job, which its kind is named after ("lightning", "hf"); else None."""
        return self.name if self.loop == "trainer" else None

    @property
    def factory(self) -> str | None:
        """The `module:callable` the spec imports (a built-in resolved, a framework's prefix stripped); None for
        a script, which is run by path."""
        if self.loop == "script":
            return None
        if self.loop == "trainer":
            return self.spec.partition(":")[2]
        return BUILTIN.get(self.spec, self.spec)

    def alone_command(self) -> str | None:
        """The shell command that runs the job alone, as its user would (`python /abs/train.py ARGS`), for a
        message; None where there is none (a factory runs only under autotune or its Trainer)."""
        return "python " + self.spec[len(SCRIPT_PREFIX) :] if self.loop == "script" else None

    def normalize(self) -> str:
        """The spec as a study records it: a script's path made absolute and the file checked (PipelineError,
        exit 2, when it is missing or not Python); any other spec as written."""
        if self.loop != "script":
            return self.spec
        from autotune.pipelines import script

        return script.normalize(self.spec)

    def preload_modules(self) -> tuple[str, ...]:
        """What a warm server imports for this job, so every trial forked from it starts with them loaded:
        its heavy libraries and its factory's module (never a script: it runs in the trial)."""
        if self.loop == "script":
            return _SCRIPT_PRELOAD
        module = (self.factory or "").partition(":")[0]
        if self.loop == "trainer":
            return (*_FRAMEWORK_PRELOAD[self.name], module)
        return (*_BUILTIN_PRELOAD.get(self.spec, ()), module)

    def study_defaults(self, global_batch: int | None, given: Collection[str] = ()) -> dict[str, Any]:
        """The workload fields (lr, lr_scaling) the job's own source sets when the user gave none (`given`):
        a script's, read from it (autotune.pipelines.script.study_defaults); {} for any other kind."""
        if self.loop != "script":
            return {}
        from autotune.pipelines import script

        return script.study_defaults(self.spec, global_batch, given)

    def why_not_checkable(self, cfg: TrialConfig) -> str | None:
        """Why parity and time to target cannot judge this job's runs (a script that never seeds torch
        cannot reproduce a run), or None: they can."""
        if self.loop != "script":
            return None
        from autotune.pipelines import script

        return script.not_checkable(cfg)


def kind_of(spec: str) -> Kind:
    """The kind of job `spec` names (see the module's table). Reads only the prefix: never imports the job,
    so it is free to ask anywhere, before a study exists."""
    if spec.startswith(SCRIPT_PREFIX):
        return Kind("script", spec, "script", "a user's script", ("script", "diff"))
    prefix, sep, _ = spec.partition(":")
    if sep and prefix == "lightning":
        return Kind("lightning", spec, "trainer", "a framework pipeline", ("lightning",))
    if sep and prefix == "hf":
        return Kind("hf", spec, "trainer", "a framework pipeline", ("hf",))
    return Kind("pipeline", spec, "autotune", "a pipeline", ())
