"""What a trial records of each knob, and the one refusal of a knob a job cannot honour.

Every kind of job (autotune's own loop, a framework's Trainer, a user's script) writes its result's
`applied` with `knob_effect`: what was asked, what was in effect, and why they differ when they do. The
learning rate's record says which lr the trial trained with against the one it was given; a knob the job
cannot express, asked for anyway, stops the trial with one message (exit 5) whatever the kind.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Collection

from autotune.core.config import KNOBS, TrialConfig, lr_factor
from autotune.core.errors import TrialUnsupported


# What a job saw of each knob: the value in effect, and why it differs from the one asked for when it does.
Seen = dict[str, tuple[Any, str]]
# Why a script's baseline records each knob at the script's own value.
AS_WRITTEN = "the baseline runs the script's own settings"


def effects(cfg: TrialConfig, seen: Seen, unsupported: Collection[str] = ()) -> dict[str, Any]:
    """Each knob seen, recorded against what the config asked of it (`knob_effect`); a knob the job cannot
    express (`unsupported`) and that was not seen, at its (default) value, with why."""
    return unsupported_effects(cfg, unsupported) | {
        k: knob_effect(getattr(cfg, k), ran, why) for k, (ran, why) in seen.items()
    }


def knob_effect(requested: Any, in_effect: Any, why: str = "") -> dict[str, Any]:
    """One knob's record in a result's `applied`: {"requested", "in_effect"}, and "why" when it says something."""
    rec = {"requested": requested, "in_effect": in_effect}
    if why:
        rec["why"] = why
    return rec


def lr_effect(
    cfg: TrialConfig, given: Any, trained: Any, own_batch: int | None = None, global_batch: int | None = None
) -> dict[str, Any]:
    """The lr a trial trained with against the lr it was given, and the rule between them.

    own_batch None: autotune's own `lr`, given for the study's reference batch and scaled to the config's
    global batch. Otherwise the job's own lr (a framework's, a script's), meant for the job's own global
    batch `own_batch`, which the rule scales from to `global_batch`, the one the trained lr is for (the
    config's unless given)."""
    to = cfg.global_batch_size if global_batch is None else global_batch
    if own_batch is None:
        if trained == given:
            return knob_effect(given, given)
        return knob_effect(
            given,
            trained,
            f"{cfg.lr_scaling} rule: global batch {cfg.global_batch_size} "
            f"vs the {cfg.reference_batch} that lr is given for",
        )
    if to == own_batch or cfg.lr_scaling == "none":
        return knob_effect(given, trained, f"the pipeline's own learning rate (its global batch {own_batch})")
    factor = lr_factor(to / own_batch, cfg.lr_scaling)
    return knob_effect(
        given,
        trained,
        f"the pipeline's own lr, meant for its global batch {own_batch}, x "
        f"{factor:.4g}: {cfg.lr_scaling} rule for global batch {to}",
    )


def refuse_unsupported(cfg: TrialConfig, unsupported: Collection[str]) -> None:
    """Exit 5 (TrialUnsupported) when the config sets a knob the job cannot honour away from its default or
    the baseline's (a hand-written config: the search keeps them there), naming each with why where the job says
    (`unsupported.why[knob]`); or sets a knob it takes to a value it cannot (`unsupported.values[knob]`)."""
    default, own = TrialConfig(), dict(cfg.baseline or ())  # a knob the job keeps: recorded at its own value
    refused = [
        k for k in sorted(set(unsupported) & set(KNOBS)) if getattr(cfg, k) not in (getattr(default, k), own.get(k))
    ]
    why = getattr(unsupported, "why", {})
    said = [f"{k} ({why[k]})" if why.get(k) else k for k in refused]
    values = getattr(unsupported, "values", {})
    said += [
        f"{k} {getattr(cfg, k)} ({values[k][getattr(cfg, k)]})" for k in sorted(values) if getattr(cfg, k) in values[k]
    ]
    if said:
        raise TrialUnsupported("the pipeline does not support: " + ", ".join(said))


def unsupported_effects(cfg: TrialConfig, unsupported: Collection[str]) -> dict[str, Any]:
    """The knobs a job cannot express, recorded at their (default) value, with why."""
    why = getattr(unsupported, "why", {})
    return {k: knob_effect(getattr(cfg, k), getattr(cfg, k), why.get(k, "")) for k in unsupported}
