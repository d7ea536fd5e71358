"""What trial 0's record changes in a script study (search/space/resolve.py): the baseline takes the batch its
run reported as the script's own, whenever the baseline did not record that one, autotune's default 8
included (rebased); the loader knobs are fixed where every DataLoader it built loads an IterableDataset,
which the trials keep as written (loaders_kept)."""

from __future__ import annotations

from typing import Any

from autotune.core.config import TrialConfig
from autotune.pipelines.script import ITERABLE_KEPT
from autotune.search.space.resolve import loaders_kept, rebased
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace

SPEC = "script:train.py --batch_size=8"


def _applied(batch: Any) -> dict[str, Any]:
    own = {"batch_size": batch, "accumulation": 1, "from": "at.batch_size()'s default as the run handed it over"}
    return {"script": {"own": own, "api_calls": {"batch_size": 1}}}


def test_a_batch_the_source_could_not_say_is_recorded_even_at_autotune_s_default() -> None:
    base = TrialConfig(pipeline=SPEC)  # the source could not say: no batch in the baseline
    got = rebased(base, _applied(8))
    assert got is not None and dict(got.baseline or ())["batch_size"] == 8
    assert rebased(base, _applied(6)) is not None and dict(rebased(base, _applied(6)).baseline or ())["batch_size"] == 6


def test_nothing_to_rebase_when_the_baseline_says_it_or_the_run_reported_none() -> None:
    told = TrialConfig(pipeline=SPEC, baseline={"batch_size": 8})
    assert rebased(told, _applied(8)) is None
    assert rebased(TrialConfig(pipeline=SPEC), {"script": {"own": None}}) is None  # a script with no batch
    assert rebased(TrialConfig(pipeline=SPEC), {}) is None
    assert rebased(TrialConfig(pipeline=SPEC, global_batch=32), _applied(8)) is None  # the study fixes it


SPACE = SearchSpace(
    {
        "num_workers": IntRange(0, 2),
        "persistent_workers": Choices((False, True)),
        "prefetch_factor": Choices((None, 4)),
        "pin_memory": Fixed(False),
        "optimizer_fusion": Choices(("none", "fused")),
    }
)


def _loaders(*kept: str | None) -> dict[str, Any]:
    return {"script": {"loaders": [{"num_workers": 0} | ({"kept": k} if k else {}) for k in kept]}}


def test_loaders_over_an_iterable_dataset_fix_the_loader_knobs() -> None:
    base = TrialConfig(pipeline=SPEC)
    space, fixed = loaders_kept(SPACE, base, _loaders(ITERABLE_KEPT, ITERABLE_KEPT))
    assert fixed == ["num_workers", "prefetch_factor", "persistent_workers"]
    assert space.searched() == ["optimizer_fusion"] and space["num_workers"] == Fixed(0)
    assert space["prefetch_factor"] == Fixed(None) and space["persistent_workers"] == Fixed(False)


def test_a_loader_the_trials_tune_keeps_the_loader_knobs_searched() -> None:
    base = TrialConfig(pipeline=SPEC)
    assert loaders_kept(SPACE, base, _loaders(ITERABLE_KEPT, None)) == (SPACE, [])  # one map-style loader
    assert loaders_kept(SPACE, base, {"script": {"loaders": []}}) == (SPACE, [])  # none built: the source's call
    assert loaders_kept(SPACE, base, {}) == (SPACE, [])
