"""The DataLoader seam's parts for a script: the micro-batch handed over through its DataLoaders, whether a
loader's order comes from the generator the trial seeds, and why `autotune run` keeps a loader as written.
What each loader ran is recorded in records.py.

May import: autotune.core, autotune.pipelines, the rest of autotune.trial.loop and trial.measurement.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import RandomSampler

from autotune.pipelines.script import api


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
