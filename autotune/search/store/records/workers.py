"""A fleet's workers and its claims in the study's user attrs: one attr per worker, one per claim (who
resolves a `--create-only` study's space, who finishes the study).
"""

from __future__ import annotations

from typing import Any, TypedDict
from collections.abc import Mapping

import optuna


WORKER_PREFIX = "worker:"  # one attr per fleet worker: "worker:<host>:<pid>:<uuid>" -> WorkerEntry
RESOLVER = "resolver"  # the claim of the worker that resolves a `--create-only` study's space
FINISHER = "finisher"  # the claim of the worker that finishes a fleet's study


class WorkerEntry(TypedDict, total=False):
    """A fleet worker: who it is, and whether it is still running."""

    host: str
    pid: int
    started: float
    state: str  # running | done
    heartbeat: float


def worker_key(host: str, pid: int, unique: str) -> str:
    return f"{WORKER_PREFIX}{host}:{pid}:{unique}"


def worker(study: optuna.Study, key: str) -> WorkerEntry:
    """The worker stored under `key`; {} when there is none."""
    return dict(study.user_attrs.get(key) or {})  # type: ignore[return-value]


def workers(study: optuna.Study) -> dict[str, WorkerEntry]:
    """Every worker recorded in the study, by key (entries that are not a worker's mapping left out)."""
    return {
        k: WorkerEntry(**v) for k, v in study.user_attrs.items() if k.startswith(WORKER_PREFIX) and isinstance(v, dict)
    }


def write_worker(study: optuna.Study, key: str, entry: WorkerEntry | Mapping[str, Any]) -> None:
    study.set_user_attr(key, dict(entry))


def claimant(study: optuna.Study, claim: str) -> Any:
    """Who holds the claim `claim` (RESOLVER, FINISHER) as the study was loaded; None: nobody."""
    return study.user_attrs.get(claim)


def write_claim(study: optuna.Study, claim: str, me: str) -> None:
    study.set_user_attr(claim, me)
