"""The model an unedited script trains: the outermost module it calls whose parameters its optimizer holds.

Found at the first forward after the optimizer is built, by a global forward pre-hook and forward hook pair
(they count how deep in module calls the script is, so a block inside the model is never taken for it); both
are removed once it is found, so no module call pays for them afterwards. Where the script builds several
optimizers (a GAN, a teacher and a student), no one module is "the model": the finder says so and takes none.

The model seams of one trial of an unedited script: the knobs it routes through the model its optimizer
trains (precision, channels_last, checkpoint_segments, compile; on several ranks the trial's replicate), applied
when the model is first called, in one fixed order (checkpointing, the memory format, data-parallel, autocast:
torchtitan's; compile last, of the forward only), and what each showed (`effects`).

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.effects import knob_effect
from autotune.core.errors import TrialUnsupported
from autotune.trial.loop.script import channels_last, checkpointing, compiled, precision
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


KNOBS = ("precision", "channels_last", "checkpoint_segments", "compile")
SEVERAL = (
    "the script builds {n} optimizers (a GAN, a teacher and a student, an EMA copy): no one module is the model "
    "its optimizer trains, so {knobs} cannot be applied with no edit"
)
WHERE = "applied to the model its optimizer trains ({name}), no edit"


class ModelSeams:
    """routed: the knobs this trial applies through the model (those the script hands no at.* call for);
    as_written: the baseline, whose model is only watched (its output dtype: the script's own precision)."""

    def __init__(self, cfg: TrialConfig, routed: Collection[str], as_written: bool, ranks: Ranks | None = None) -> None:
        self.cfg, self.routed, self.as_written = cfg, tuple(k for k in KNOBS if k in routed), as_written
        # gpus for a script with no process group of its own: the model replicated (one process: nothing to do)
        self.ranks = ranks or Ranks(torch.device("cpu"), 0, 1)
        self.finder = ModelFinder(self.found)
        self.handles: list[Any] = []
        self.autocast: precision.Autocast | None = None
        self.seen: str | None = None  # the baseline's output dtype, watched
        self.graphs_before: int | None = None  # dynamo's graph count when its forward was compiled
        self.activations: checkpointing.ActivationBytes | None = None  # counted where blocks are checkpointed
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
        base = baseline_of(self.cfg)
        if self.as_written:
            return []
        return [k for k in self.routed if getattr(self.cfg, k) != getattr(base, k)] + ["gpus"] * self.ranks.active

    def found(self, model: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The model's first call: what it is, then each knob applied to it, checkpointing first."""
        self.ranks.decide()
        self.fed = fed_batch(args)
        blocks = checkpointing.blocks(model)
        self.facts = {
            "model": type(model).__name__,
            "optimizers": self.finder.optimizers,
            "convolutions": len(channels_last.convolutions(model)),
            "repeated_blocks": len(blocks),
            "block": type(blocks[0]).__name__ if blocks else None,
            "replicated_by_trial": not self.ranks.own_group,  # with gpus > 1: the trial's replicate, of this model
        }
        if self.as_written:
            self.handles.append(model.register_forward_hook(self._watch))
            return None
        if self.finder.optimizers > 1 and self.changed():
            raise TrialUnsupported(SEVERAL.format(n=self.finder.optimizers, knobs=", ".join(self.changed())))
        if "checkpoint_segments" in self.changed():
            if not blocks:
                why = checkpointing.NO_BLOCKS
                raise TrialUnsupported(f"checkpoint_segments {self.cfg.checkpoint_segments}: {why}")
            chosen = checkpointing.apply(model, self.cfg.checkpoint_segments)
            self.activations = checkpointing.ActivationBytes(model, chosen)
        if "channels_last" in self.changed():
            if not self.facts["convolutions"]:
                raise TrialUnsupported(f"channels_last: {channels_last.NO_CONV}")
            channels_last.apply(model)
            self.handles.append(model.register_forward_pre_hook(lambda m, a: channels_last.inputs(a)))
            args = channels_last.inputs(args)
        # Data-parallel after the weights take their final format (DDP's buckets view them), before autocast:
        # its pre-hook then runs first, and its forward hook sees the model's own outputs.
        args = self.ranks.replicate(model, args)
        if "precision" in self.changed():
            device = next(model.parameters()).device.type
            self.autocast = precision.Autocast(self.cfg.precision, device)
            self.handles.append(model.register_forward_pre_hook(self.autocast.pre))
            self.handles.append(model.register_forward_hook(self.autocast.post))
            self.autocast.pre(model, args)  # this call's pre-hooks were listed before it was added
        if "compile" in self.changed():  # this call runs eagerly (its forward was read before the hooks ran)
            self.graphs_before = compiled.apply(model, self.cfg.compile)
        return args

    def record(self) -> dict[str, Any]:
        """What the trial records of the model (`applied.script.model`, which trial 0's lessons read): what
        it is, the knobs routed to it, and, watched in the baseline, the precision its output came in (the
        script's own); {} when no model was found."""
        if not self.facts:
            return {}
        return self.facts | {"routed": list(self.routed), **({"own_precision": self.seen} if self.seen else {})}

    def site(self) -> dict[str, Any]:
        """What the diff needs to write the model knobs as plain torch lines (apply/export/_compute.py): the
        model's class, to find the variable that names it, and the blocks checkpointed; {} when none was found."""
        if self.model is None:
            return {}
        return {"class": self.facts.get("model"), "checkpointed": checkpointing.wrapped(self.model)}

    def observed(self) -> dict[str, Any]:
        """What the model showed as it ran (`applied.observed`): its output's precision (inside the trial's
        autocast, else as the baseline ran it), whether its 4-D weights are channels_last, how many of its
        blocks carry checkpoint hooks and, where some do, the activation bytes its first forward held and
        freed (checkpointing.ActivationBytes), whether it runs data-parallel; {} when no model was found."""
        model = self.model
        if model is None:
            return {}
        return {
            "model_output_precision": self.autocast.seen if self.autocast is not None else self.seen,
            "model_weights_channels_last": channels_last.in_effect(model),
            "model_checkpointed_blocks": len(checkpointing.wrapped(model)),
            "model_replicated": self.ranks.model is not None,
            **({"model_activation_bytes": self.activations.observed()} if self.activations else {}),
        }

    def _watch(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self.seen is None:
            self.seen = precision.observed_dtype(output)

    def effects(self) -> dict[str, Any]:
        """Each routed knob as the model ran it: the output dtype inside the autocast, the weights' memory
        format, the blocks that carry checkpoint hooks; why, where the model was never found."""
        model = self.model
        if model is None:
            why = "the script's optimizer never trained a module it called (no model found): as the script runs"
            return {k: knob_effect(getattr(self.cfg, k), None, why) for k in self.routed}
        where = WHERE.format(name=self.facts.get("model"))
        out: dict[str, Any] = {}
        if "precision" in self.routed:
            out["precision"] = self._precision(where)
        if "channels_last" in self.routed:
            out["channels_last"] = knob_effect(self.cfg.channels_last, channels_last.in_effect(model), where)
        if "compile" in self.routed:
            out["compile"] = knob_effect(
                self.cfg.compile, *compiled.applied_seen(self.cfg.compile, self.graphs_before, where)
            )
        if "checkpoint_segments" in self.routed:
            wrapped = checkpointing.wrapped(model)
            said = (
                f"{where}: {len(wrapped)} of its {self.facts.get('repeated_blocks')} {self.facts.get('block')} block(s)"
            )
            if self.activations is not None and (counted := self.activations.observed()):
                said += "; " + checkpointing.freed_said(counted)
            out["checkpoint_segments"] = knob_effect(self.cfg.checkpoint_segments, wrapped, said)
        return out

    def _precision(self, where: str) -> dict[str, Any]:
        if self.autocast is None:  # the baseline (watched: the script's own precision), or its precision kept
            seen = self.seen or baseline_of(self.cfg).precision
            return knob_effect(self.cfg.precision, seen, f"the script's own: its model returned {seen}")
        said = f"{where}: autocast around its forward, its outputs handed back in fp32"
        if self.autocast.outer is not None:
            said += f"; inside the script's own autocast ({self.autocast.outer}), which the trial's replaced there"
        return knob_effect(self.cfg.precision, self.autocast.seen or "fp32", said)
