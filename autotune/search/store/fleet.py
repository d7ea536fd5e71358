"""Workers of one study, and which of them finishes it.

A fleet's workers stop at different times (their own --budget or --n-trials). Confirmation and the
parity check must run once, after the last trial, by the worker that finishes last: each worker
records itself in the study when it joins and marks itself done when its trials are spent; the
one that finds no other worker still alive (a crashed one counts as gone: same host, its pid is gone;
another host, no heartbeat for STALE_AFTER_S) is elected among those finishing at once, last writer
wins, as the resolver of a deferred study is.

Whoever can write a study chooses the code its workers import (the pipeline is `module:factory`), so a
worker checks the study's pipeline against the ones its own command line allows (`check_pipeline`)
before it imports anything the study names.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Collection

import optuna

from autotune.core.config import TrialConfig
from autotune.core.errors import PipelineError
from autotune.pipelines import BUILTIN
from autotune.search.store import _optuna, records
from autotune.search.store.liveness import _owner_alive

SETTLE_S = 1.0  # workers that finish together all write their claim within this; the last one wins
# What a worker imports when its command line names no pipeline: autotune's own code, nothing the study names.
DEFAULT_ALLOWED = ("unet",)


def check_pipeline(study: optuna.Study, allowed: Collection[str]) -> None:
    """Refuse (bad input, one line) a study whose pipeline is not one of `allowed`, the worker's own
    --pipeline values, before anything of the study is imported. The pipeline is read as joining reads
    it (TrialConfig.from_dict of the workload), so the name checked is the name that would be imported."""
    workload = records.StudyRecord.of(study).workload
    if workload is None:  # joining refuses a study `autotune search` did not make, importing nothing
        return
    spec = TrialConfig.from_dict(workload).pipeline
    if _target(spec) in {_target(a) for a in allowed}:
        return
    # repr: the name comes from whoever wrote the study; it must not reach the terminal raw.
    raise PipelineError(
        f"study {study.study_name!r} names pipeline {spec!r}, not one this worker may run "
        f"({', '.join(map(repr, allowed))}): whoever can write a study chooses the code its workers "
        "import; if you trust them, start the worker with --pipeline naming it"
    )


def _target(spec: str) -> str:
    """A built-in's short name and its module:factory are the same import."""
    return BUILTIN.get(spec, spec)


def register(study: optuna.Study) -> str:
    """Record this worker as running; returns its key in the study's user attrs."""
    me: records.WorkerEntry = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "state": "running",
    }
    key = records.worker_key(me["host"], me["pid"], uuid.uuid4().hex[:12])  # unique even for two in one process
    records.write_worker(study, key, me)
    return key


def beat(study: optuna.Study, key: str) -> None:
    """A heartbeat, so that workers on other hosts can tell this one is alive."""
    me = records.worker(study, key)
    if me:
        records.write_worker(study, key, {**me, "heartbeat": time.time()})


def finishes(study: optuna.Study, key: str) -> bool:
    """Mark this worker done; True when it is the one to finish the study (no other worker alive,
    and it won the claim among those that finished with it)."""
    records.write_worker(study, key, {**records.worker(study, key), "state": "done"})
    if _others_running(fresh(study), key):
        return False
    won = claim(study, records.FINISHER, key)
    return won is not None and not _others_running(won, key)


def claim(study: optuna.Study, attr: str, me: str) -> optuna.Study | None:
    """Elect one among processes claiming at once, last writer wins: write `me` under `attr`, let the
    others' writes land (SETTLE_S), and return the study freshly loaded when `me` stayed; None when
    another process won."""
    records.write_claim(study, attr, me)
    time.sleep(SETTLE_S)
    loaded = fresh(study)
    return loaded if records.claimant(loaded, attr) == me else None


def fresh(study: optuna.Study) -> optuna.Study:
    """The study loaded again: what other processes have written since it was loaded."""
    return optuna.load_study(study_name=study.study_name, storage=_optuna.storage_of(study))


def _others_running(study: optuna.Study, key: str) -> bool:
    return any(k != key and v.get("state") == "running" and _owner_alive(v) for k, v in records.workers(study).items())
