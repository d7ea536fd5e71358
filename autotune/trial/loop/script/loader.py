"""The DataLoader knobs for a script (num_workers, pin_memory, persistent_workers, prefetch_factor), and
the data order: what a trial sets over the script's own DataLoader arguments, and what each loader ran.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import RandomSampler

from autotune.core.effects import Seen
from autotune.pipelines.script import LOADER_KNOBS, api
from autotune.trial.loop.script.shown import Shown


# A loader `autotune run` left as written: the exported trial never iterated it (Seams.measured).
UNMEASURED = "no trial measured it (the exported trial never iterated it): the script's own"


def handed_batch(trial: api.Trial, arguments: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The trial's micro-batch in place of the script's own, where it reaches the script through its
    DataLoaders (it calls no at.batch_size()) and this one is built with the script's own batch (one with
    another, an evaluation loader's, or a batch sampler of its own keeps its batches), handed over as
    at.batch_size() hands it (Trial.handed: the script's own and the trial's are recorded)."""
    if not trial.through_loader or trial.batch_size is None or arguments.get("batch_sampler") is not None:
        return {}
    if own["batch_size"] != trial.own_batch_size:
        return {}
    return {"batch_size": trial.handed("batch_size", own["batch_size"], trial.batch_size)}


def shuffled(it: Any) -> bool:
    """Whether a DataLoader iterator draws its order from the loader's generator (a RandomSampler, the one
    the trial seeds with the data seed); a sequential or distributed sampler keeps its own order."""
    sampler = getattr(it, "_index_sampler", None)
    sampler = getattr(sampler, "sampler", sampler)
    return isinstance(sampler, RandomSampler)


def seen(shown: Shown, unsupported: frozenset[str], why: str) -> Seen:
    """Each supported DataLoader knob as the script's first loader it was applied to ran it (`autotune run`
    leaves the loaders no trial measured as written), else its first."""
    loader = next(
        (x for x in shown.loaders if x.get("kept") != UNMEASURED), shown.loaders[0] if shown.loaders else None
    )
    out: Seen = {}
    for k in LOADER_KNOBS:
        if k in unsupported:
            continue
        out[k] = (
            (loader[k], loader.get("kept", why)) if loader else (None, "the script built no DataLoader in this run")
        )
    return out


def data_order(shown: Shown, trial: api.Trial) -> str | None:
    """Where the trial's data seed reached the data this run trained on: at.data_seed() (a script that draws
    its batches itself), or a DataLoader that shuffles by its generator; None: nowhere, so parity's data-order
    twin would train on the baseline's own batches."""
    if "data_seed" in trial.calls:
        return "at.data_seed()"
    if shown.shuffled:
        return "a DataLoader that shuffles (the trial seeds its generator)"
    return None
