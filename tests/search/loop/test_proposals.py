"""search/loop/proposals.py: a proposal the session would not run is drawn again before it becomes a
trial, so the study holds only what ran; a small space is listed whole, and a search on one runs each
config once and ends by saying the space is exhausted."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core.config import TrialConfig
from autotune.core.outcomes import Reason
from autotune.core.settings import SearchSettings
from autotune.search.loop.proposals import Proposals, every_config
from autotune.search.loop.session import SearchSession
from autotune.search.loop.strategy import MOVE_KEY, REJECTED_KEY, CoordinateSampler, make_tpe
from autotune.search.space.reading import load_space
from autotune.search.space.spec import DEFAULT_SPACE, SearchSpace
from autotune.search.space.suggest import suggest
from autotune.search.store.records import TrialRecord

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

KNOBS = {"batch_size": [4, 8], "num_workers": [0, 1], "persistent_workers": [False, True]}
# 6 configs: with 0 workers persistent_workers is not asked (inert), so 2 batches x (1 + 2).
SMALL = SearchSpace.from_dict({"knobs": {k: {"choices": v} for k, v in KNOBS.items()}})
BASE = TrialConfig()


def test_a_small_space_is_listed_once_each_and_a_large_one_is_not() -> None:
    every = every_config(SMALL, BASE, 512)
    assert every is not None and len(every) == 6
    assert len({tuple(sorted(cfg.knobs().items())) for _, cfg in every}) == 6
    assert ({"batch_size": 4, "num_workers": 0}, BASE.replace(batch_size=4)) in every
    assert every_config(SMALL, BASE, 5) is None
    assert every_config(load_space(DEFAULT_SPACE), BASE, 512) is None


def test_a_proposal_turned_down_is_drawn_again_before_any_param_is_set() -> None:
    sampler = Proposals(make_tpe(seed=0), SMALL, BASE)
    wanted = BASE.replace(batch_size=8, num_workers=1, persistent_workers=True)
    sampler.screen = lambda cfg: None if cfg == wanted else "measured"
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for _ in range(3):  # whatever TPE draws first: what is asked is the one config the screen lets through
        trial = study.ask()
        assert suggest(trial, SMALL, BASE) == wanted
        study.tell(trial, 1.0)


def test_the_coordinate_pass_moves_on_from_a_move_turned_down() -> None:
    sampler = Proposals(CoordinateSampler(seed=0), SMALL, BASE)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"batch_size": 8, "num_workers": 0})
    baseline = study.ask()
    suggest(baseline, SMALL, BASE)
    study.tell(baseline, 10.0)
    sampler.screen = lambda cfg: "memory" if cfg.batch_size == 4 else None  # the pass's first move: batch 8 -> 4
    trial = study.ask()
    cfg = suggest(trial, SMALL, BASE)
    attrs = study._storage.get_trial_system_attrs(trial._trial_id)
    assert cfg.batch_size == 8 and cfg.num_workers == 1  # its next move
    assert [m["knob"] for m in attrs[REJECTED_KEY]] == ["batch_size"] and attrs[MOVE_KEY]["knob"] == "num_workers"


@pytest.mark.slow
def test_a_search_on_a_small_space_runs_each_config_once_and_ends_exhausted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"knobs": KNOBS}))
    tiny = TrialConfig(pipeline="tests.fault_pipelines:tiny", image_size=32, warmup_steps=1, timed_steps=2, window=1)
    settings = SearchSettings(
        budget_s=600.0,
        storage=str(tmp_path / "studies.db"),
        space=str(space),
        studies_dir=str(tmp_path / "studies"),
        base=tiny,
        parity_steps=0,
        confirm_rounds=0,
        memory_headroom=0.0,
    )
    said: list[str] = []
    session = SearchSession.create(settings, warm=True, say=said.append)
    outcome = session.run()
    trials = session.study.get_trials(deepcopy=False)
    records = [TrialRecord.from_frozen(t) for t in trials]
    written_off = {Reason.CLASS_FAILED, Reason.MEMORY_ESTIMATE, Reason.COST_ESTIMATE}
    assert [r for r in records if r.repeat_of is not None or r.reason in written_off] == []
    firsts = [r for r in records if r.retry_of is None]  # a contended figure is measured once more, on purpose
    ran = {tuple(sorted(r.config.items())) for r in firsts}
    every = every_config(session.space, tiny, 512)
    assert every is not None and {tuple(sorted(cfg.knobs().items())) for _, cfg in every} <= ran
    assert len(ran) == len(firsts) == outcome.trials - (len(records) - len(firsts))  # each config once
    assert any("the space is exhausted" in line for line in said), said
