"""The model an unedited script trains: the outermost module it calls whose parameters its optimizer holds.

Found at the first forward after the optimizer is built, by a global forward pre-hook and forward hook pair
(they count how deep in module calls the script is, so a block inside the model is never taken for it); both
are removed once it is found, so no module call pays for them afterwards. Where the script builds several
optimizers (a GAN, a teacher and a student), no one module is "the model": the finder says so and takes none.

The model seams of one trial of an unedited script: the model knobs of the knob list (autotune/core/knobs/)
that it routes through the model its optimizer trains, and on several ranks the trial's replicate, applied when
the model is first called in the list's order, each by its torch side (autotune/trial/loop/knobs/, the module
of its name: `unfit`, `seam`, `watch` in the baseline, `seen`, `observed`, `recorded`), and what each showed
(`knobs_seen`).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves

from autotune.core.config import TrialConfig
from autotune.core.effects import Seen
from autotune.core.errors import TrialUnsupported
from autotune.core.knobs import MODEL_NAMES
from autotune.trial.loop import knobs
from autotune.trial.loop.script.ranks import Ranks


OnFound = Callable[[torch.nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]


class ModelFinder:
    """Watches module calls, once armed with the optimizer's parameters, until the model is called.

    on_found(model, args): what the model's own forward pre-hook would do on this first call (it is added
    while the call's pre-hooks already run, so torch does not call it now); its result replaces the args."""

    def __init__(self, on_found: OnFound) -> None:
        self.on_found = on_found
        self.model: torch.nn.Module | None = None
        self.params: set[int] = set()
        self.optimizers = 0
        self.depth = 0
        self.handles: list[Any] = []

    def arm(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer was built: watch module calls for the model that holds its parameters."""
        self.optimizers += 1
        self.params |= {id(p) for group in optimizer.param_groups for p in group["params"]}
        if self.model is None and not self.handles:
            self.handles = [
                register_module_forward_pre_hook(self._pre),  # type: ignore[arg-type]
                register_module_forward_hook(self._post, always_call=True),
            ]

    def disarm(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.depth += 1
        if self.depth != 1 or self.model is not None:
            return None
        if not any(id(p) in self.params for p in module.parameters()):
            return None
        self.model = module
        self.disarm()  # this call's forward hook (_post) is already listed: it still runs, once
        return self.on_found(module, args)

    def _post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.depth -= 1


def fed_batch(args: tuple[Any, ...]) -> int | None:
    """The batch a model call was given: the first dimension of its first tensor of one dimension or more
    (tuples, lists, dicts, nested); None where it was given none (its inputs passed by keyword)."""
    for leaf in tree_leaves(args):
        if isinstance(leaf, torch.Tensor) and leaf.dim():
            return int(leaf.shape[0])
    return None


SEVERAL = (
    "the script builds {n} optimizers (a GAN, a teacher and a student, an EMA copy): no one module is the model "
    "its optimizer trains, so {knobs} cannot be applied with no edit"
)
WHERE = "applied to the model its optimizer trains ({name}), no edit"


def _nothing(*args: Any) -> dict[str, Any]:
    """A part a model knob's torch side leaves out: nothing to add."""
    return {}


@dataclass(frozen=True)
class Found:
    """What a model knob's record reads of the model the trial found: the model, its facts, and where the knobs
    were applied (in words)."""

    model: torch.nn.Module
    facts: dict[str, Any]
    where: str


class ModelSeams:
    """routed: the knobs this trial applies through the model (those the script hands no at.* call for);
    as_written: the baseline, whose model each knob only watches (`watch`: the script's own settings)."""

    def __init__(self, cfg: TrialConfig, routed: Collection[str], as_written: bool, ranks: Ranks | None = None) -> None:
        self.cfg, self.routed, self.as_written = cfg, tuple(k for k in MODEL_NAMES if k in routed), as_written
        # gpus for a script with no process group of its own: the model replicated (one process: nothing to do)
        self.ranks = ranks or Ranks(torch.device("cpu"), 0, 1)
        self.finder = ModelFinder(self.found)
        self.handles: list[Any] = []
        self.states: dict[str, Any] = {}  # each applied (or watched) knob's state, for its record (an autocast...)
        self.facts: dict[str, Any] = {}
        self.fed: int | None = None  # the first dimension of the first tensor its first call was given

    @property
    def model(self) -> torch.nn.Module | None:
        return self.finder.model

    def arm(self, optimizer: torch.optim.Optimizer) -> None:
        """Watch for the model (its first call pays for the hooks, none after): the knobs routed to it, the
        ranks that replicate it, and, in any run, the batch it is fed (`fed`)."""
        self.finder.arm(optimizer)

    def close(self) -> None:
        self.finder.disarm()
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def changed(self) -> list[str]:
        """The knobs this trial applies to the model away from the baseline's (the script's own run)."""
        if self.as_written:
            return []
        return [k for k in self.routed if k in self.cfg.changed] + ["gpus"] * self.ranks.active

    def found(self, model: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The model's first call: what it is, then each knob applied to it, checkpointing first."""
        self.ranks.decide()
        self.fed = fed_batch(args)
        self.facts = {"model": type(model).__name__, "optimizers": self.finder.optimizers}
        for knob in knobs.MODEL:  # what each knob's rules read of it (its 4-D weights, its repeated blocks)
            self.facts |= getattr(knob, "facts", _nothing)(model)
        self.facts["replicated_by_trial"] = not self.ranks.own_group  # with gpus > 1: the trial's replicate
        if self.as_written:  # only watched: what each knob shows of the script's own run
            for knob in knobs.MODEL:
                if (watch := getattr(knob, "watch", None)) is not None:
                    self.states[knob.NAME] = watch(model, self.handles)
            return None
        changed = self.changed()
        if self.finder.optimizers > 1 and changed:
            raise TrialUnsupported(SEVERAL.format(n=self.finder.optimizers, knobs=", ".join(changed)))
        for knob in knobs.BEFORE_PARALLEL:
            args = self._apply(knob, model, args, changed)
        # Data-parallel after the weights take their final format (DDP's buckets view them), before autocast:
        # its pre-hook then runs first, and its forward hook sees the model's own outputs.
        args = self.ranks.replicate(model, args)
        for knob in knobs.AFTER_PARALLEL:
            args = self._apply(knob, model, args, changed)
        return args

    def _apply(self, knob: Any, model: torch.nn.Module, args: tuple[Any, ...], changed: list[str]) -> tuple[Any, ...]:
        name = knob.NAME
        if name not in changed:
            return args
        if why := getattr(knob, "unfit", lambda m: None)(model):
            raise TrialUnsupported(f"{name} {getattr(self.cfg, name)}: {why}")
        self.states[name], args = knob.seam(model, self.cfg, args, self.handles)
        return args

    def record(self) -> dict[str, Any]:
        """What the trial records of the model (`applied.script.model`, which trial 0's lessons read): what
        it is, the knobs routed to it, and what each knob recorded of it (watched in the baseline: the script's
        own settings); {} when no model was found."""
        if not self.facts:
            return {}
        out = self.facts | {"routed": list(self.routed)}
        for knob in knobs.MODEL:
            out |= getattr(knob, "recorded", _nothing)(self.states.get(knob.NAME))
        return out

    def site(self) -> dict[str, Any]:
        """What the diff needs to write the model knobs as plain torch lines (apply/export/_compute.py): the
        model's class, to find the variable that names it, and the blocks checkpointed; {} when none was found."""
        if self.model is None:
            return {}
        site: dict[str, Any] = {"class": self.facts.get("model")}
        for knob in knobs.MODEL:
            site |= getattr(knob, "site", _nothing)(self.model)
        return site

    def observed(self) -> dict[str, Any]:
        """What the model showed as it ran (`applied.observed`): what each model knob's torch side observed of
        it (its output's precision inside the trial's autocast, else as the baseline ran it; its 4-D weights'
        format; the blocks that carry checkpoint hooks and the activation bytes they freed), whether it runs
        data-parallel; {} when no model was found."""
        found = self._found()
        if found is None:
            return {}
        out: dict[str, Any] = {"model_replicated": self.ranks.model is not None}
        for knob in knobs.MODEL:
            out |= getattr(knob, "observed", _nothing)(found, self.states.get(knob.NAME))
        return out

    def _found(self) -> Found | None:
        if self.model is None:
            return None
        return Found(self.model, self.facts, WHERE.format(name=self.facts.get("model")))

    def knobs_seen(self) -> Seen:
        """Each routed knob as the model ran it (each knob's `seen`): the output dtype inside the autocast,
        the weights' memory format, the blocks that carry checkpoint hooks; why, where the model was never
        found."""
        found = self._found()
        if found is None:
            why = "the script's optimizer never trained a module it called (no model found): as the script runs"
            return {k: (None, why) for k in self.routed}
        return {k.NAME: k.seen(found, self.cfg, self.states.get(k.NAME)) for k in knobs.MODEL if k.NAME in self.routed}
