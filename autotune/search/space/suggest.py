"""From a resolved search space to a config: what Optuna is asked for each knob (suggest), and the params
that make an enqueued config come back exactly (config_params)."""

from __future__ import annotations

from typing import Any

import optuna

from autotune.core.config import KNOBS, TrialConfig, in_effect, inert
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace, Spec, spec_values


def micro_batch_param(gpus: int) -> str:
    """The micro-batch's Optuna parameter when a global batch is fixed and the GPU count is searched:
    one per count, since each count allows its own divisors and a parameter's choices may not change."""
    return f"batch_size_gpus{gpus}"


def _per_gpu_count(space: SearchSpace, base: TrialConfig) -> bool:
    """Whether the micro-batch is sampled after the GPU count, among that count's divisors of the
    study's global batch (search/space/resolve.py)."""
    return (
        base.global_batch is not None
        and isinstance(space.knobs.get("gpus"), (Choices, IntRange))
        and "batch_size" in space.knobs
    )


def _ask(trial: optuna.trial.Trial, name: str, spec: Spec) -> Any:
    if isinstance(spec, Fixed):
        return spec.value
    if isinstance(spec, IntRange):
        return trial.suggest_int(name, spec.low, spec.high, step=spec.step, log=spec.log)
    v = trial.suggest_categorical(name, spec.values)
    # An enqueued 1 matches the choice True (1 == True) and comes back as 1: map it back.
    return spec.values[spec.values.index(v)]


def suggest(trial: optuna.trial.Trial, space: SearchSpace, base: TrialConfig) -> TrialConfig:
    """Ask `trial` for every searched knob (in KNOBS order) and return `base` with them applied. A knob
    whose lead is off (each lead comes before its dependents) is not asked: it is set inert."""
    chosen: dict[str, Any] = {}
    per_count = _per_gpu_count(space, base)
    order = ("gpus", *(k for k in KNOBS if k != "gpus")) if per_count else KNOBS
    for k in order:
        spec = space.knobs.get(k)
        if spec is None or not in_effect(k, {**base.knobs(), **chosen}):
            continue
        if k == "batch_size" and per_count:
            g = chosen["gpus"]
            divisors = [b for b in spec_values(spec) if base.admits(b, g)]
            chosen[k] = _ask(
                trial, micro_batch_param(g), Choices(tuple(divisors)) if len(divisors) > 1 else Fixed(divisors[0])
            )
        else:
            chosen[k] = _ask(trial, k, spec)
    chosen |= inert({**base.knobs(), **chosen})
    return base.replace(**chosen)


def _as_suggested(cfg: TrialConfig, space: SearchSpace) -> dict[str, Any]:
    """cfg's knobs with the space's fixed values over them, as suggest() will see them."""
    return {**cfg.knobs(), **{k: s.value for k, s in space.knobs.items() if isinstance(s, Fixed)}}


def config_params(cfg: TrialConfig, space: SearchSpace) -> dict[str, Any]:
    """The params for `study.enqueue_trial` that make suggest() return `cfg` on the knobs the space
    can express. Optuna raises inside suggest_categorical, mid-trial, for an enqueued choice that is
    not in the list (and 1 == True would match the wrong one), so such a knob is left out: the sampler
    picks it, and the enqueued trial still runs `cfg` exactly (its config user attr). Fixed knobs are
    not params; suggest() applies their fixed value whatever `cfg` says.
    """
    params: dict[str, Any] = {}
    values, per_count = _as_suggested(cfg, space), _per_gpu_count(space, cfg)
    for k in space.searched():
        if not in_effect(k, values):
            continue
        spec, v = space.knobs[k], getattr(cfg, k)
        if k == "batch_size" and per_count:
            params[micro_batch_param(cfg.gpus)] = v  # its count's parameter (an integer choice: no 1 == True)
            continue
        if isinstance(spec, Choices) and not any(type(v) is type(c) and v == c for c in spec.values):
            continue
        params[k] = v
    return params


__all__ = ["config_params", "micro_batch_param", "suggest"]
