"""Ask only for what will be run: the study's sampler, wrapped so that a proposal is checked (admission's
`screen`: measured already, in a failed class, over the memory or the cost estimate) before it becomes
the trial's params, and drawn again when it would not be run.

Why a sampler wrapper: in Optuna a trial exists from `study.ask()` on, and its params are sampled as
`suggest` asks for them; a suggested param cannot be drawn again, and a trial cannot be taken back out
of the study. The one point where a proposal exists and no param is set yet is the trial's first
suggest, when Optuna calls `sample_relative`. There the wrapper draws a whole config: the inner sampler's
relative params, completed by its `sample_independent` for the rest, through autotune's own `suggest`
(the conditional knobs included), and screens it; a config turned down is drawn again (TPE and random
draw anew; the coordinate pass moves on to its next move). The accepted config's params are stored in
the trial's system attrs (PROPOSAL_KEY) and `sample_independent` returns them, so the trial runs exactly
the config that was screened. After DRAWS turned-down draws, a space small enough to list (ENUMERABLE
configs) gives one of its configs that would be run; a larger space gives the last draw, which admission
then writes off as before. Enqueued trials (the baseline, the warm start, re-measurements) run as queued.

The session asks `left()` before each `study.ask()`: a small space in which no config would be run ends
the search as exhausted, without a trial.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig
from autotune.search.loop.admission import Screen
from autotune.search.loop.strategy import FIXED_KEY
from autotune.search.space.spec import SearchSpace
from autotune.search.space.suggest import suggest
from autotune.search.store import _optuna

PROPOSAL_KEY = "autotune:proposal"  # trial system attr: the screened config's params, as suggest asks them
DRAWS = 16  # draws of the inner sampler before a listed space is searched for a config that would run
ENUMERABLE = 512  # configs a space may have to be listed whole

Draft = tuple[dict[str, Any], TrialConfig]  # (params as suggest asks them, the config they make)


class Proposals(BaseSampler):
    """`inner`, proposing only configs that `screen` (set by the session before each ask) lets through."""

    def __init__(self, inner: BaseSampler, space: SearchSpace, base: TrialConfig) -> None:
        self.inner, self.space, self.base = inner, space, base
        self.screen: Screen = lambda cfg: None
        self._every = every_config(space, base, ENUMERABLE)  # None: too many to list

    def left(self) -> Counter[str | None] | None:
        """How many of the space's configs `screen` would run (the None key) or turns down, by why; None
        when the space is too large to list."""
        if self._every is None:
            return None
        return Counter(self.screen(cfg) for _, cfg in self._every)

    # ---- Optuna's sampler interface ----------------------------------------------------------------

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if FIXED_KEY in trial.system_attrs:  # enqueued: it runs as queued
            return self.inner.sample_relative(study, trial, search_space)
        params = self._proposal(study, trial, search_space)
        _optuna.storage_of(study).set_trial_system_attr(_optuna.trial_id(trial), PROPOSAL_KEY, params)
        return {k: v for k, v in params.items() if k in search_space}

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        chosen = trial.system_attrs.get(PROPOSAL_KEY) or {}
        if param_name in chosen:
            return chosen[param_name]
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()

    # ---- drawing -----------------------------------------------------------------------------------

    def _proposal(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for _ in range(DRAWS):
            params, cfg = self._drawn(study, trial, search_space)
            if self.screen(cfg) is None:
                return params
            reject = getattr(self.inner, "reject", None)  # the coordinate pass: that move counts as proposed
            if reject is not None:
                reject(study, trial)
        runnable = [p for p, cfg in self._every or () if self.screen(cfg) is None]
        return random.Random(trial.number).choice(runnable) if runnable else params

    def _drawn(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> Draft:
        """One whole config from the inner sampler, as the trial's suggests would take it."""
        relative = self.inner.sample_relative(study, trial, search_space)
        latest = copy.copy(trial)  # with the system attrs the inner sampler just wrote (its move)
        latest.system_attrs = _optuna.storage_of(study).get_trial_system_attrs(_optuna.trial_id(trial))

        def pick(name: str, dist: BaseDistribution) -> Any:
            if name in relative and name in search_space:
                return relative[name]
            return self.inner.sample_independent(study, latest, name, dist)

        return _draft(self.space, self.base, pick)


class _Trial:
    """What `suggest` asks of an optuna.Trial, answered by `pick` and recorded: a config drafted without
    a trial (Optuna's single-valued distributions take their one value, as a trial's do)."""

    def __init__(self, pick: Callable[[str, BaseDistribution], Any]) -> None:
        self.params: dict[str, Any] = {}
        self._pick = pick

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._take(name, IntDistribution(low, high, step=step, log=log)))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._take(name, CategoricalDistribution(choices))

    def _take(self, name: str, dist: BaseDistribution) -> Any:
        value = _values(dist)[0] if dist.single() else self._pick(name, dist)
        self.params[name] = value
        return value


def _draft(space: SearchSpace, base: TrialConfig, pick: Callable[[str, BaseDistribution], Any]) -> Draft:
    trial = _Trial(pick)
    cfg = suggest(trial, space, base)  # type: ignore[arg-type]  # the two suggests it calls
    return trial.params, cfg


class _TooMany(Exception):
    pass


def every_config(space: SearchSpace, base: TrialConfig, limit: int) -> list[Draft] | None:
    """Every config the space makes (each once: a depth-first walk over suggest's choices), or None when
    there are more than `limit`."""
    out: list[Draft] = []
    stack: list[tuple[int, ...]] = [()]
    try:
        while stack and len(out) <= limit:
            prefix = stack.pop()
            draft, path, sizes = _walk(space, base, prefix, limit)
            out.append(draft)
            stack.extend((*path[:i], j) for i in range(len(prefix), len(path)) for j in range(1, sizes[i]))
    except _TooMany:
        return None
    return None if stack or len(out) > limit else out


def _walk(
    space: SearchSpace, base: TrialConfig, prefix: tuple[int, ...], limit: int
) -> tuple[Draft, list[int], list[int]]:
    """The config whose choices start with `prefix` (by index) and take the first value after it; the
    index and the number of values of each choice made."""
    path: list[int] = []
    sizes: list[int] = []

    def pick(name: str, dist: BaseDistribution) -> Any:
        values = _values(dist)
        if len(values) > limit:
            raise _TooMany
        path.append(prefix[len(path)] if len(path) < len(prefix) else 0)
        sizes.append(len(values))
        return values[path[-1]]

    return _draft(space, base, pick), path, sizes


def _values(dist: BaseDistribution) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    raise _TooMany  # a float range: not listable (autotune's spaces have none)
