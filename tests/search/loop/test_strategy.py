"""The default strategy (`--sampler auto`): enqueued trials as enqueued, then a one-knob-at-a-time pass from
the best feasible config, never re-proposing a measured config, then TPE; all of it derived from the study."""

from __future__ import annotations

import warnings
from typing import Any
from collections.abc import Callable

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from autotune.core.config import KNOBS, TrialConfig
from autotune.search.store.records import CLASSES, REFERENCE, TrialRecord, write
from autotune.search.store.results import failed_classes
from autotune.search.space.spec import DEFAULT_SPACE, WORKER_KNOBS, Fixed
from autotune.search.space.machine import Hardware
from autotune.search.space.resolve import for_hardware
from autotune.search.space.reading import load_space
from autotune.search.space.suggest import config_params, suggest
from autotune.search.loop.strategy import CHECKED, MOVE_KEY, PASS, MovePrices, CoordinateSampler, incumbent, move_values
from autotune.search.loop.study import make_sampler

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

CPU = Hardware(cuda=False, gpu_count=0, cpu_count=2, apex=False)
SPACE = for_hardware(load_space(DEFAULT_SPACE), CPU, stages=5)[0]
BASE = TrialConfig()
WARM = BASE.replace(
    num_workers=2, precision="bf16", optimizer_fusion="fused", persistent_workers=True, prefetch_factor=2
)
Objective = Callable[[TrialConfig], "float | None"]  # None: infeasible (an OOM, say)


def new_study(
    sampler: optuna.samplers.BaseSampler | None = None, storage: Any = None, name: str | None = None
) -> optuna.Study:
    """As autotune's open_study: trial 0 the baseline, trial 1 the warm start, enqueued with fixed params."""
    study = optuna.create_study(
        direction="maximize", sampler=sampler or CoordinateSampler(seed=0), storage=storage, study_name=name
    )
    for cfg in (BASE, WARM):
        study.enqueue_trial(config_params(cfg, SPACE))
    return study


def step(study: optuna.Study, objective: Objective) -> tuple[TrialConfig, optuna.trial.FrozenTrial]:
    """ask -> suggest (autotune's own) -> tell; an infeasible config is recorded as the runner does."""
    trial = study.ask()
    cfg = suggest(trial, SPACE, BASE)
    value = objective(cfg)
    trial.set_constraint("infeasible", 0.0 if value is not None else 1.0)
    return cfg, study.tell(trial, 0.0 if value is None else value)


def run(study: optuna.Study, objective: Objective, n: int) -> list[TrialConfig]:
    return [step(study, objective)[0] for _ in range(n)]


def flat(cfg: TrialConfig) -> float:
    return 100.0


def separable(cfg: TrialConfig) -> float:
    """Each knob of the pass on its own: the optimum is bf16, batch 64, 2 workers, channels_last, fused."""
    value = 10.0 * {"fp32": 1.0, "bf16": 1.5}[cfg.precision]
    value *= {4: 0.5, 8: 1.0, 16: 1.6, 32: 1.7, 64: 2.0}[cfg.batch_size]
    value *= {0: 1.0, 1: 1.2, 2: 1.3}[cfg.num_workers]
    value *= 1.1 if cfg.channels_last else 1.0
    return value * {"none": 1.0, "foreach": 1.02, "fused": 1.05}[cfg.optimizer_fusion]


OPTIMUM = dict(precision="bf16", batch_size=64, num_workers=2, channels_last=True, optimizer_fusion="fused")


def moves(study: optuna.Study) -> list[tuple[str, Any]]:
    return [
        (t.system_attrs[MOVE_KEY]["knob"], t.system_attrs[MOVE_KEY]["value"])
        for t in study.get_trials(deepcopy=False)
        if MOVE_KEY in t.system_attrs
    ]


def changed(a: TrialConfig, b: TrialConfig) -> set[str]:
    return {k for k in KNOBS if getattr(a, k) != getattr(b, k)}


def test_auto_is_the_coordinate_sampler() -> None:
    assert isinstance(make_sampler("auto", 0), CoordinateSampler)


def test_enqueued_trials_run_as_enqueued() -> None:
    study = new_study()
    first, second = run(study, lambda cfg: 100.0 if cfg == BASE else 50.0, 2)
    assert first == BASE and second == WARM
    assert [MOVE_KEY in t.system_attrs for t in study.trials] == [False, False]


def test_after_the_enqueued_trials_one_knob_changes_from_the_incumbent() -> None:
    study = new_study()
    run(study, separable, 2)  # the warm start (bf16, 2 workers, fused) beats the baseline
    for _ in range(6):
        done = [t for t in study.trials if t.state == TrialState.COMPLETE]
        best = max(done, key=lambda t: t.value)
        before = suggest(optuna.trial.FixedTrial(best.params), SPACE, BASE)
        cfg, frozen = step(study, separable)
        move = frozen.system_attrs[MOVE_KEY]
        assert move["from"] == best.number
        allowed = {move["knob"]} | (set(WORKER_KNOBS) if move["knob"] == "num_workers" else set())
        assert changed(before, cfg) and changed(before, cfg) <= allowed, (before, cfg)
        assert move["knob"] in PASS and getattr(cfg, move["knob"]) == move["value"]
    assert moves(study)[:3] == [("precision", "fp32"), ("batch_size", 64), ("batch_size", 16)]  # from the warm start


def test_never_proposes_a_measured_config_while_moves_remain() -> None:
    study = new_study()
    study.enqueue_trial(config_params(BASE.replace(precision="bf16"), SPACE))  # the pass's first move, measured
    objective: Objective = lambda cfg: 100.0 if cfg == BASE else 50.0  # the baseline stays the incumbent
    seen = run(study, objective, 3)
    pass_ = []
    for _ in range(30):
        cfg, frozen = step(study, objective)
        if MOVE_KEY not in frozen.system_attrs:
            break
        pass_.append(cfg)
    assert len(pass_) >= 6
    configs = [c.knobs() for c in seen + pass_]
    assert len({tuple(sorted(c.items(), key=str)) for c in configs}) == len(configs)  # no repeats at all
    assert moves(study)[0] == ("batch_size", 64)  # precision=bf16 from the baseline was measured: skipped


def test_finds_the_optimum_of_a_separable_objective_in_few_trials() -> None:
    study = new_study()
    configs = run(study, separable, 10)  # 2 enqueued + the pass (8 moves on this CPU space)
    best = max(configs, key=separable)
    assert {k: getattr(best, k) for k in OPTIMUM} == OPTIMUM


def test_infeasible_trials_are_never_the_incumbent() -> None:
    """Batch 64 is the fastest but over a constraint (say, the memory headroom): its figure is recorded
    with a constraint > 0, and no move starts from it."""
    study = new_study()
    configs = []
    for _ in range(10):
        trial = study.ask()
        cfg = suggest(trial, SPACE, BASE)
        trial.set_constraint("infeasible", 1.0 if cfg.batch_size == 64 else 0.0)
        study.tell(trial, separable(cfg) * (100 if cfg.batch_size == 64 else 1))
        configs.append(cfg)
    infeasible = [t.number for t in study.trials if t.constraints["infeasible"] > 0]
    assert infeasible, "the pass tried batch 64"
    assert incumbent(study.get_trials()).number not in infeasible
    later = [t for t in study.trials if t.number > infeasible[0] and MOVE_KEY in t.system_attrs]
    assert len(later) >= 4
    assert all(t.system_attrs[MOVE_KEY]["from"] not in infeasible for t in later)
    assert all(configs[t.number].batch_size != 64 for t in later)  # nothing moved from the infeasible config
    best = max((c for c in configs if c.batch_size != 64), key=separable)
    assert {k: getattr(best, k) for k in OPTIMUM} == {**OPTIMUM, "batch_size": 16}  # the best feasible one


def test_a_failed_class_never_anchors_the_pass() -> None:
    """A larger batch is fast, and its class then fails its check (stored as the search stores it): the
    pass moves from the best config outside it, and no later move proposes a config in it."""
    study = new_study()
    while not any(t.params.get("batch_size", 8) != 8 for t in study.trials):
        trial = study.ask()
        cfg = suggest(trial, SPACE, BASE)
        trial.set_constraint("infeasible", 0.0)
        math = (f"global batch 8 -> {cfg.batch_size}",) if cfg.batch_size != 8 else ()
        write(trial, TrialRecord(role="search", config=cfg.knobs(), training_math=math))
        study.tell(trial, separable(cfg) * (100 if math else 1))
    fast = study.trials[-1]
    assert incumbent(study.get_trials()).number == fast.number  # before the verdict it leads
    label = f"global batch 8 -> {fast.params['batch_size']}"
    study.set_user_attr(CLASSES, {label: {"verdict": "fail"}})
    assert failed_classes(study) == {label}
    assert incumbent(study.get_trials(), failed_classes(study)).number != fast.number
    for cfg, t in (step(study, separable) for _ in range(4)):
        assert t.system_attrs[MOVE_KEY]["from"] != fast.number and cfg.batch_size != fast.params["batch_size"]


class SpyTPE(optuna.samplers.TPESampler):
    def __init__(self) -> None:
        super().__init__(seed=0, multivariate=True, constant_liar=True, n_startup_trials=6)
        self.asked: set[int] = set()

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        self.asked.add(trial.number)
        return super().sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        self.asked.add(trial.number)
        return super().sample_independent(study, trial, name, dist)


def test_hands_over_to_tpe_after_the_pass() -> None:
    tpe = SpyTPE()
    study = new_study(CoordinateSampler(tpe=tpe))
    run(study, flat, 2 + 8 + 5)
    in_pass = [t.number for t in study.trials if MOVE_KEY in t.system_attrs]
    assert in_pass == list(range(2, 10))  # the pass: 8 moves on this CPU space, then no more
    assert not tpe.asked & set(in_pass)  # TPE proposed none of the pass's configs...
    assert set(range(10, 15)) <= tpe.asked  # ...and every trial after it


def test_a_reloaded_study_continues_the_pass() -> None:
    reference = new_study(CoordinateSampler(seed=0))
    run(reference, separable, 10)
    storage = optuna.storages.InMemoryStorage()
    study = new_study(CoordinateSampler(seed=0), storage=storage, name="s")
    run(study, separable, 5)
    # A new process: a fresh sampler instance, a different seed, the same study.
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=CoordinateSampler(seed=123))
    run(resumed, separable, 5)
    assert moves(resumed) == moves(reference) and len(moves(reference)) == 8


def test_concurrent_workers_take_different_moves() -> None:
    study = new_study()
    trials = [study.ask() for _ in range(2)]  # the baseline and the warm start, still running
    cfgs = [suggest(t, SPACE, BASE) for t in trials]
    running = [study.ask() for _ in range(4)]  # more workers start while those run
    cfgs += [suggest(t, SPACE, BASE) for t in running]
    keys = [tuple(sorted(c.knobs().items(), key=str)) for c in cfgs]
    assert len(set(keys)) == len(keys)
    assert all(MOVE_KEY in study.trials[t.number].system_attrs for t in running)
    assert all(len(changed(BASE, c) - set(WORKER_KNOBS)) == 1 for c in cfgs[2:])  # from the queued baseline


@pytest.mark.parametrize(
    "dist, was, expected",
    [
        (IntDistribution(0, 8), 0, [8, 4]),
        (IntDistribution(0, 8), 8, [4, 0]),
        (IntDistribution(1, 8), 1, [8, 4]),
        (CategoricalDistribution([4, 8, 16, 32, 64]), 8, [64, 16]),
        (CategoricalDistribution(["fp32", "bf16", "fp16"]), "fp32", ["bf16", "fp16"]),
        (CategoricalDistribution([False, True]), False, [True]),
    ],
)
def test_move_values_are_a_few_representative_values(dist: Any, was: Any, expected: list[Any]) -> None:
    assert move_values(dist, was) == expected


# ---- the order follows the budget left: same-math moves first when a check would not fit ----------


def priced_run(study: optuna.Study, n: int, wall_s: float = 20.0) -> list[optuna.trial.FrozenTrial]:
    """`step`, each trial's wall time recorded as the runner records it (what MovePrices prices a trial by)."""
    out = []
    for _ in range(n):
        trial = study.ask()
        cfg = suggest(trial, SPACE, BASE)
        trial.set_constraint("infeasible", 0.0)
        write(trial, TrialRecord(role="search", config=cfg.knobs(), wall_s=wall_s))
        out.append(study.tell(trial, separable(cfg)))
    return out


def test_a_short_budget_proposes_the_same_math_moves_and_no_move_whose_check_would_not_fit() -> None:
    """Trials of 20 s, so a check is about 60 s and a math move 80 s: with 60 s left, the pass runs every
    same-math move it has (loader, layout, fusion...) and no batch-size or precision move."""
    study = new_study(CoordinateSampler(seed=0, budget_left=lambda: 60.0))
    trials = priced_run(study, 2 + 12)
    pass_ = [t.system_attrs[MOVE_KEY]["knob"] for t in trials if MOVE_KEY in t.system_attrs]
    same = [k for k in PASS if k not in CHECKED and k in SPACE.knobs and not isinstance(SPACE.knobs[k], Fixed)]
    assert pass_ and set(pass_) == set(same), pass_
    assert not CHECKED & set(pass_)


def test_as_the_budget_runs_down_the_math_moves_that_no_longer_fit_give_way_to_same_math_ones() -> None:
    """150 s, each trial spending 20 s of it; a math move costs 20 s + a check of 3 x 20 s. Precision and
    batch 64 still fit when their turn comes (110 s, 90 s left); batch 16 does not (70 s), so the pass goes
    on with the loader and the other same-math knobs, and proposes no math move again."""
    study: optuna.Study = new_study()
    study.sampler = CoordinateSampler(seed=0, budget_left=lambda: 150.0 - 20.0 * len(study.trials[:-1]))
    trials = priced_run(study, 2 + 8)
    pass_ = [t.system_attrs[MOVE_KEY]["knob"] for t in trials if MOVE_KEY in t.system_attrs]
    assert pass_[:3] == ["precision", "batch_size", "num_workers"], pass_
    assert len(pass_) > 3 and not CHECKED & set(pass_[2:])


def test_a_budget_that_buys_the_whole_pass_keeps_the_declared_order() -> None:
    long = new_study(CoordinateSampler(seed=0, budget_left=lambda: 1e6))
    free = new_study(CoordinateSampler(seed=0))
    priced_run(long, 2 + 8)
    priced_run(free, 2 + 8)
    assert moves(long) == moves(free)
    assert moves(long)[0][0] == "precision"  # PASS's first knob, a math one


def test_the_prices_count_a_check_as_the_study_measured_it() -> None:
    study = new_study()
    priced_run(study, 2, wall_s=10.0)
    prices = MovePrices.of(study, 100.0)
    assert prices is not None and (prices.trial_s, prices.check_s) == (10.0, 30.0)  # no reference: 3 runs
    assert prices.cost({"knob": "batch_size"}) == 40.0 and prices.cost({"knob": "num_workers"}) == 10.0
    # The first check also measured the reference, now stored: the next one is the candidate's run.
    study.set_user_attr(REFERENCE, {"losses": [1.0]})
    study.set_user_attr(CLASSES, {"precision fp32 -> bf16": {"verdict": "pass", "seconds": 42.0, "trial": 2}})
    assert MovePrices.of(study, 100.0).check_s == 10.0  # type: ignore[union-attr]
    later = {"verdict": "fail", "seconds": 16.0, "trial": 5}
    study.set_user_attr(CLASSES, {**study.user_attrs[CLASSES], "global batch 8 -> 16": later})
    assert MovePrices.of(study, 100.0).check_s == 16.0  # type: ignore[union-attr]
    assert MovePrices.of(new_study(), 100.0) is None  # nothing measured: nothing to price, the declared order


def test_a_check_that_rode_on_its_trial_is_priced_at_its_steps_past_the_window() -> None:
    """Trials carried the reference (search/checks/riding.py): no check paid for it, so every check's seconds,
    a ridden one's few seconds past its window included, is the price of the next."""
    study = new_study()
    priced_run(study, 2, wall_s=10.0)
    study.set_user_attr(REFERENCE, {"losses": [1.0], "carried": True})
    assert MovePrices.of(study, 100.0).check_s == 10.0  # type: ignore[union-attr]  # none yet: a trial's length
    ridden = {"verdict": "pass", "seconds": 3.0, "trial": 1, "runs": 0}
    study.set_user_attr(CLASSES, {"precision fp32 -> bf16": ridden})
    assert MovePrices.of(study, 100.0).check_s == 3.0  # type: ignore[union-attr]
    study.set_user_attr(CLASSES, {"precision fp32 -> bf16": {**ridden, "seconds": 0.0}})
    assert MovePrices.of(study, 100.0).check_s == 0.0  # type: ignore[union-attr]  # its window held them all


def test_a_math_move_whose_check_fits_in_the_export_reserve_is_still_proposed() -> None:
    """60 s left and 60 s kept to check the export: a math move (20 s + a 60 s check) can still be run and
    checked by the gate if it wins, so the declared order stands; with no reserve it would not be."""
    study = new_study(CoordinateSampler(seed=0, budget_left=lambda: 60.0, check_reserve=60.0))
    trials = priced_run(study, 3)
    assert trials[2].system_attrs[MOVE_KEY]["knob"] == "precision"
