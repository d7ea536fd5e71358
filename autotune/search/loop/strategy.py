"""The default search strategy (`--sampler auto`): one coordinate pass from the best config so far, then TPE.

Why: a throughput search is short (tens of trials, each a minute or more), and most of the speedup usually
comes from a few knobs acting nearly independently (precision, batch size, loader workers, GPUs, compile...).
TPE starts blind: its first six proposals are random and it needs several more to learn which knobs matter.
Changing one knob at a time from the better of the baseline and the warm start finds most of that speedup
within a handful of trials, and everything it measures still teaches TPE, which takes over once the pass
is done to search the interactions and the knobs the pass leaves out. benchmarks/search_efficiency.py
replays the strategies over a recorded grid (this pass, TPE alone, random, pass and TPE alternated); its
figures are in benchmarks/README.md.

The pass is cost-aware: it visits only the knobs in PASS, most influential first, and at most
ORDERED_MOVES representative values of a numeric knob (its high end, then its middle or low end: more
batch, workers and GPUs is the usual direction of a speedup), every other value of a categorical one. On
the full default space that is about 8 trials on a CPU-only machine and 12 on a 1-GPU one (14 with 8 GPUs).

State lives in the study, never in this object: autotune runs several worker processes on one study and
resumes studies, so every proposal is derived from `study.get_trials()`. Each move is written to its
trial's system attrs (MOVE_KEY: the knob, its old and new value, the full params), so any process knows
which moves were proposed. The incumbent is the best trial whose own figure ranks (`records.outcome`: an OOM
or other infeasible config is recorded with a constraint > 0 and is never the incumbent). A move whose
config was measured, is running or is queued is skipped, and each (knob, value) is proposed at most once,
so the pass ends after at most sum(moves per knob) trials. Enqueued trials (the baseline and warm start)
keep Optuna's fixed params; anything they leave open, and every trial after the pass, is TPE's, built as
`make_sampler('tpe')` builds it.

The pass spends the budget left (`budget_left`: the trial loop's seconds, asked at each proposal; None:
no budget, every move in the declared order). A move's price is its trial, and for a knob whose
declaration has a `math` (batch size, GPUs, precision: its move makes a training-math class) also the
class check that must pass before its gain can be exported; a same-math move (loader, fusion, layout,
threads) buys its gain for its trial alone. Both prices are the study's own figures (MovePrices.of: the median
measured trial; a check as the study measured one, the baseline's reference runs counted once, else
three trials: the reference's two runs and the candidate's). The rule: the declared order, less the math
moves whose trial and check no longer fit in the trial loop's time left and the reserve the end of the
search keeps to check the export (`check_reserve`: the gate checks the winner's class there, so a late
math move may still win and be checked). So when the budget is short, the same-math moves come before
the math moves that would not fit, which are not proposed at all: a gain that cannot be checked cannot
be exported. Both are the session's to set (Budget.search_left, Budget.parity_reserve_s); unset, the
declared order.

Why not cheapest first whenever the whole pass does not fit (every same-math move before any math move):
the study cannot measure what a knob buys before the pass moves it, so the declared order (the knobs that
usually matter most first) is the only prior on gain. On the recorded grid cheapest-first reached a checked
95% of the best later than the declared order, and the rule above matches the declared order there
(benchmarks/README.md, the move order).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import LEADS, TABLE, turns_on
from autotune.search.store import _optuna, records
from autotune.search.store.records import TrialRecord, config_key, value_key
from autotune.search.store.results import class_label, failed_classes, feasible, rank
from autotune.search.space.spec import WORKER_KNOBS

# Knobs whose move makes a training-math class, so that its gain is exportable only after a class check.
CHECKED = frozenset(k.name for k in TABLE if k.math)
# Runs of a class check, each about a trial's length: the baseline's reference (2 runs) and the candidate.
CHECK_RUNS, CHECK_RUNS_STORED = 3, 1

# The knobs the pass visits, in their declared order (knob's visit in TrialConfig): the ones that usually
# move throughput most first. The rest (pin_memory, set_to_none, num_threads, activation checkpointing, the
# worker-only knobs) are left to TPE.
PASS = tuple(k.name for k in sorted((k for k in TABLE if k.visit is not None), key=lambda k: k.visit or 0))
ORDERED_MOVES = 2  # values tried for a numeric knob (int range or numeric choices)
MOVE_KEY = "autotune:coordinate"  # trial system attr: {"knob", "was", "value", "from", "params"}
# Trial system attr: the moves proposals.py turned down for this trial before it ran one (each a MOVE_KEY
# value); they count as proposed, so the pass goes on to its next move instead of proposing them again.
REJECTED_KEY = "autotune:coordinate_rejected"
FIXED_KEY = "fixed_params"  # Optuna's system attr on an enqueued trial
# Trials whose config counts as taken: measured (feasible or not, pruned), in progress, or queued.
TAKEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


@dataclass(frozen=True)
class MovePrices:
    """What the pass may spend and what a move costs, in seconds, from the study's measurements."""

    left_s: float  # the budget left to the trial loop
    reserve_s: float  # kept after the trial loop to check the export's class (the parity gate)
    trial_s: float  # a trial: the median measured wall time
    check_s: float  # a class check: as measured, else CHECK_RUNS trials (CHECK_RUNS_STORED with a reference)

    def cost(self, move: dict[str, Any]) -> float:
        """A move's price to an exportable result: its trial, and its class check for a knob with math."""
        return self.trial_s + (self.check_s if move["knob"] in CHECKED else 0.0)

    def buys(self, move: dict[str, Any]) -> bool:
        """Whether a move can still end in an exportable result: a same-math one always, a math one when
        its trial and its check fit in the trial loop's time left and the export's reserve (whether the
        trial itself may start is the session's and admission's question, with their grace)."""
        return move["knob"] not in CHECKED or self.cost(move) <= self.left_s + self.reserve_s

    @classmethod
    def of(cls, study: Study, left_s: float, reserve_s: float = 0.0) -> MovePrices | None:
        """The study's figures with `left_s` left; None before any trial was measured (nothing to price)."""
        walls = [
            w
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if (w := TrialRecord.from_frozen(t).wall_s or (t.duration.total_seconds() if t.duration else None))
        ]
        if not walls:
            return None
        trial_s = statistics.median(walls)
        # A check's measured seconds, in the order they ran (one that rode on its trial: its steps past the
        # window). A check run of its own that found no reference measured it first, and it is stored and not
        # run again, so with it stored the later ones are the price; trials' own reference was no check's.
        checks = [
            float(v["seconds"])
            for v in sorted(records.class_checks(study).values(), key=lambda v: v.get("trial") or 0)
            if v.get("seconds") is not None
        ]
        reference = records.parity_reference(study)
        if reference:
            later = checks if reference.get("carried") else checks[1:]
            check_s = statistics.median(later) if later else CHECK_RUNS_STORED * trial_s
        else:
            check_s = statistics.median(checks) if checks else CHECK_RUNS * trial_s
        return cls(left_s, reserve_s, trial_s, check_s)


def make_tpe(seed: int | None) -> TPESampler:
    """TPE, the one build of it: `--sampler tpe` (study.make_sampler) and the pass's successor. constant_liar
    keeps concurrent workers from proposing the same config."""
    return TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=6)


class CoordinateSampler(BaseSampler):
    """A coordinate pass from the incumbent, then (or, with tpe_every=k, every k-th search trial) TPE.

    tpe_every: 0 runs the whole pass before TPE; k > 0 hands every k-th search trial of the pass to TPE.
    plan: the knobs the pass visits, in order (PASS).
    budget_left: the seconds left to the trial loop, asked at each proposal (None, or it answering None:
    no budget, the declared order); the session sets it to its Budget's search_left.
    check_reserve: the seconds kept after the trial loop to check the export (Budget.parity_reserve_s)."""

    def __init__(
        self,
        seed: int | None = None,
        *,
        tpe_every: int = 0,
        plan: Sequence[str] = PASS,
        tpe: BaseSampler | None = None,
        budget_left: Callable[[], float | None] | None = None,
        check_reserve: float = 0.0,
    ) -> None:
        self._tpe = tpe if tpe is not None else make_tpe(seed)
        self._tpe_every = tpe_every
        self._plan = tuple(plan)
        self.budget_left = budget_left
        self.check_reserve = check_reserve

    # ---- Optuna's sampler interface ----------------------------------------------------------------

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._tpe.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        # Called once per trial, at its first suggest. An enqueued trial's fixed params win in Optuna
        # itself; whatever it leaves open is TPE's (its random start-up), never a coordinate move.
        if FIXED_KEY in trial.system_attrs:
            return self._tpe.sample_relative(study, trial, search_space)
        move = self._next(study, trial)
        if move is None:
            return self._tpe.sample_relative(study, trial, search_space)
        # Recorded before any param is set: other workers see the move (and its config) as taken.
        _optuna.storage_of(study).set_trial_system_attr(_optuna.trial_id(trial), MOVE_KEY, move)
        return {k: v for k, v in move["params"].items() if k in search_space and _contains(search_space[k], v)}

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        # Params outside the relative (intersection) space, e.g. the worker-only knobs: the move's own.
        move = trial.system_attrs.get(MOVE_KEY)
        if move and param_name in move["params"] and _contains(param_distribution, move["params"][param_name]):
            return move["params"][param_name]
        return self._tpe.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self._tpe.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()

    def reject(self, study: Study, trial: FrozenTrial) -> None:
        """The move just proposed for `trial` will not be run (proposals.py): recorded as turned down, and
        the trial is no longer that move, so the next draw for it is the pass's next move (or TPE's)."""
        storage, tid = _optuna.storage_of(study), _optuna.trial_id(trial)
        attrs = storage.get_trial_system_attrs(tid)
        if attrs.get(MOVE_KEY):
            storage.set_trial_system_attr(tid, REJECTED_KEY, [*attrs.get(REJECTED_KEY, []), attrs[MOVE_KEY]])
            storage.set_trial_system_attr(tid, MOVE_KEY, None)

    # ---- the pass ----------------------------------------------------------------------------------

    def _next(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        if study.direction != StudyDirection.MAXIMIZE:  # the incumbent is the highest value: autotune's studies
            return None
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        if self._tpe_every > 0:
            searched = sum(1 for t in others if t.number < trial.number and FIXED_KEY not in t.system_attrs)
            if (searched + 1) % self._tpe_every == 0:
                return None  # TPE's turn
        mine = _optuna.storage_of(study).get_trial_system_attrs(_optuna.trial_id(trial)).get(REJECTED_KEY, [])
        left = self.budget_left() if self.budget_left is not None else None
        prices = MovePrices.of(study, left, self.check_reserve) if left is not None and math.isfinite(left) else None
        return next_move(others, self._plan, failed_classes(study), mine, prices)


def next_move(
    trials: Sequence[FrozenTrial],
    plan: Sequence[str] = PASS,
    failed: set[str] | frozenset[str] = frozenset(),
    rejected: Sequence[dict[str, Any]] = (),
    prices: MovePrices | None = None,
) -> dict[str, Any] | None:
    """The pass's next one-knob change from the incumbent, given the study's other trials, the
    training-math classes whose check failed, the moves turned down for this trial and what the budget
    left buys (None: no budget), or None when the pass is over (or there is nothing to start from yet)."""
    moves = remaining_moves(trials, plan, failed, rejected)
    if prices is not None:  # a math move whose trial and check do not both fit buys nothing exportable
        moves = [m for m in moves if prices.buys(m)]
    return moves[0] if moves else None


def remaining_moves(
    trials: Sequence[FrozenTrial],
    plan: Sequence[str] = PASS,
    failed: set[str] | frozenset[str] = frozenset(),
    rejected: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every move the pass has left from the incumbent, in the plan's order (the MOVE_KEY values)."""
    start = incumbent(trials, failed)
    if start is None:
        return []
    base = params_of(start)
    dists = _distributions(trials)
    taken = {config_key(params_of(t)) for t in trials if t.state in TAKEN}
    ordered = sorted(trials, key=lambda t: t.number)
    made = [m for t in ordered for m in (*t.system_attrs.get(REJECTED_KEY, []), t.system_attrs.get(MOVE_KEY)) if m]
    origin: dict[str, Any] = {}  # the value a knob had when the pass first moved it
    proposed: set[tuple[str, Any]] = set()
    for m in (*made, *rejected):
        origin.setdefault(m["knob"], m["was"])
        proposed.add((m["knob"], value_key(m["value"])))
    out: list[dict[str, Any]] = []
    for knob in plan:
        dist = dists.get(knob)
        if dist is None or dist.single() or knob not in base:
            continue
        for value in move_values(dist, origin.get(knob, base[knob])):
            if _same(value, base[knob]) or (knob, value_key(value)) in proposed:
                continue
            params = _moved(base, knob, value, dists, trials)
            if config_key(params) in taken:
                continue
            out.append({"knob": knob, "was": base[knob], "value": value, "from": start.number, "params": params})
    return out


def incumbent(trials: Sequence[FrozenTrial], failed: set[str] | frozenset[str] = frozenset()) -> FrozenTrial | None:
    """The best ranking trial (records.outcome) outside the failed training-math classes; before there is one, the
    first enqueued trial (the baseline), whatever its state, so that parallel workers can start the pass
    while it runs. A failed class's trials stay feasible (Optuna cannot constrain a finished trial), but
    a pass from one of them would only propose configs in that class, each written off unrun."""
    done = [t for t in trials if records.outcome(t).ranks and not (failed and class_label(t) in failed)]
    if done:
        return min(done, key=rank)  # the leaderboard's order
    queued = sorted((t for t in trials if FIXED_KEY in t.system_attrs), key=lambda t: t.number)
    return queued[0] if queued else None


def params_of(t: FrozenTrial) -> dict[str, Any]:
    """A trial's params, including the ones it will take but has not suggested yet (a queued or just
    started trial): its fixed params when enqueued, its move when a coordinate move."""
    move = t.system_attrs.get(MOVE_KEY)
    return {**t.system_attrs.get(FIXED_KEY, {}), **(move["params"] if move else {}), **t.params}


def move_values(dist: BaseDistribution, was: Any) -> list[Any]:
    """The values the pass tries for a knob that had `was`: for a numeric knob a few representative
    points (high end first, then the middle, then the low end; at most ORDERED_MOVES), for a categorical
    one every other choice in the space's order."""
    values = _ordered_values(dist)
    if values is None:
        return [c for c in getattr(dist, "choices", ()) if not _same(c, was)]
    mid = _middle(values, dist)
    points = list(dict.fromkeys((values[-1], mid, values[0])))
    return [v for v in points if v != was][:ORDERED_MOVES]


def _ordered_values(dist: BaseDistribution) -> list[Any] | None:
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if (
        isinstance(dist, CategoricalDistribution)
        and len(dist.choices) > 2
        and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in dist.choices)
    ):
        return sorted(dist.choices)
    return None


def _middle(values: list[Any], dist: BaseDistribution) -> Any:
    if isinstance(dist, IntDistribution) and dist.log and values[0] >= 1:
        target = math.sqrt(values[0] * values[-1])
    elif isinstance(dist, IntDistribution):
        target = (values[0] + values[-1]) / 2
    else:
        return values[len(values) // 2]
    return min(values, key=lambda v: (abs(v - target), v))


def _moved(
    base: dict[str, Any], knob: str, value: Any, dists: dict[str, BaseDistribution], trials: Sequence[FrozenTrial]
) -> dict[str, Any]:
    """`base` with knob=value, keeping autotune's conditional params consistent (suggest.suggest): the
    worker-only knobs are dropped with 0 workers, and taken from the best trial that had them (else
    their first value) when workers appear."""
    params = {**base, knob: value}
    if knob != LEADS["workers"]:
        return params
    if not turns_on("workers", value):
        return {k: v for k, v in params.items() if k not in WORKER_KNOBS}
    ranked = sorted((t for t in trials if feasible(t)), key=lambda t: -float(t.value or 0.0))
    for k in WORKER_KNOBS:
        if k in params or k not in dists:
            continue
        donor = next((t.params[k] for t in ranked if k in t.params), None)
        params[k] = donor if donor is not None and _contains(dists[k], donor) else _first(dists[k])
    return params


def _distributions(trials: Sequence[FrozenTrial]) -> dict[str, BaseDistribution]:
    """Each param's distribution as the latest trial that suggested it has it."""
    out: dict[str, BaseDistribution] = {}
    for t in sorted(trials, key=lambda t: t.number):
        out.update(t.distributions)
    return out


def _first(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[0]
    return dist.low  # type: ignore[attr-defined]


def _contains(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return any(_same(c, value) for c in dist.choices)
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same kind: True is not the choice 1 (1 == True in Python)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


__all__ = [
    "CHECKED",
    "MovePrices",
    "CoordinateSampler",
    "MOVE_KEY",
    "PASS",
    "REJECTED_KEY",
    "incumbent",
    "make_tpe",
    "move_values",
    "next_move",
    "remaining_moves",
]
