"""What trial 0's record changes in a script study (search/space/resolve.py): the baseline takes the batch its
run reported as the script's own, whenever the baseline did not record that one, autotune's default 8
included (rebased); the loader knobs are fixed where every DataLoader it built loads an IterableDataset,
which the trials keep as written (loaders_kept)."""

from __future__ import annotations

from typing import Any

from autotune.core.config import TrialConfig, baseline_of
from autotune.core.training import section, training_math
from autotune.pipelines.script import ITERABLE_KEPT
from autotune.search.space.resolve import loaders_kept, rebased
from autotune.search.space.spec import Choices, Fixed, IntRange, SearchSpace

SPEC = "script:train.py --batch_size=8"


def _applied(batch: Any, accumulation: int = 1, lr: float | None = None) -> dict[str, Any]:
    own = {
        "batch_size": batch,
        "accumulation": accumulation,
        "from": "at.batch_size()'s default as the run handed it over",
    }
    out: dict[str, Any] = {"script": {"own": own, "api_calls": {"batch_size": 1}}}
    return out | ({"lr": {"requested": lr, "in_effect": lr}} if lr is not None else {})


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


def test_the_precision_the_baseline_s_model_returned_becomes_the_baseline_s_precision() -> None:
    """A script with an autocast of its own (no at.autocast() to say it): trial 0's model seams watched its model
    return bf16, so the baseline runs bf16, as the script does; only where the trial routes precision to the
    model, and only a precision it can run."""
    base = TrialConfig(pipeline=SPEC, baseline={"batch_size": 8})

    def watched(precision: str, routed: tuple[str, ...] = ("precision",)) -> dict[str, Any]:
        return {"script": {"own": None, "model": {"routed": list(routed), "own_precision": precision}}}

    got = rebased(base, watched("bf16"))
    assert got is not None and baseline_of(got).precision == "bf16"
    assert rebased(base, watched("fp32")) is None  # what the baseline runs already
    assert rebased(base, watched("bf16", routed=("channels_last",))) is None  # not routed: at.autocast() says it
    assert rebased(base, watched("float64")) is None  # not a precision a trial runs


def test_a_script_that_keeps_its_accumulation_under_a_global_batch_has_it_counted() -> None:
    """--global-batch 32 on a script that accumulates 2 micro-batches on its own loop (no at.accumulation()):
    the batch stays the study's, the accumulation becomes the one trial 0 counted, so each GPU count's
    micro-batch is 32 / (gpus x 2)."""
    base = TrialConfig(pipeline=SPEC, global_batch=32, batch_size=32, keeps_accumulation=True)
    got = rebased(base, _applied(8, accumulation=2))
    assert got is not None and got.own_accumulation == 2 and got.baseline is None
    assert baseline_of(got).batch_size == 16 and got.admits(8, 2) and not got.admits(16, 2)
    assert rebased(base.replace(keeps_accumulation=False), _applied(8, accumulation=2)) is None


def test_the_script_s_own_accumulation_and_lr_make_the_records_say_what_ran() -> None:
    """llama2.c's shape: batch 6 handed over, 2 micro-batches accumulated by the script's own loop, lr 0.005 set
    by its configurator. The study records them, so a trial at batch 12 says the global batch and lr that ran
    (12 x 2 = 24 against 6 x 2 = 12), and best.yaml's training math says 2 accumulation steps."""
    base = rebased(TrialConfig(pipeline=SPEC), _applied(6, accumulation=2, lr=0.005))
    assert base is not None and (base.own_accumulation, base.lr) == (2, 0.005)
    assert baseline_of(base).global_batch_size == 12
    trial = base.replace(batch_size=12)
    assert training_math(trial, False) == ["global batch 12 -> 24", "lr 0.005 -> 0.00707 (sqrt rule)"]
    out = section(trial, training_math(trial, False))
    assert (out["global_batch"], out["grad_accum"], out["baseline_global_batch"]) == (24, 2, 12)
    assert training_math(baseline_of(base), False) == []
    assert rebased(base, _applied(6, accumulation=2, lr=0.005)) is None  # recorded: nothing to change


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
