"""Trials whose controller died: a RUNNING trial whose owner (host, pid, start time, heartbeat) is gone
is killed (what is left of its process groups) and failed as stale, and a lost baseline or warm start is
queued again so the study still gets one."""

from __future__ import annotations

import socket
import time
from typing import Any
from collections.abc import Mapping

import optuna
from optuna.trial import TrialState

from autotune.core.outcomes import Reason, Role
from autotune.core.procs import signal_groups
from autotune.search.store import records
from autotune.search.store.records import TrialRecord

STALE_AFTER_S = 600.0  # a trial on another host with no heartbeat for this long is presumed dead
# A live controller records itself as a trial's owner within milliseconds of ask(); a RUNNING trial
# with no owner after this long lost its controller in between (a SIGKILL, a power cut).
OWNERLESS_STALE_S = 30.0


def _owner_alive(owner: Mapping[str, Any]) -> bool:
    import psutil

    if owner.get("host") != socket.gethostname():
        return time.time() - float(owner.get("heartbeat", owner.get("started", 0))) < STALE_AFTER_S
    try:  # same host: the owning controller is alive iff its pid exists and is not a reused pid
        return psutil.Process(owner["pid"]).create_time() <= owner["started"] + 1
    except (psutil.NoSuchProcess, KeyError):
        return False


def fail_stale(study: optuna.Study, ownerless_after_s: float = OWNERLESS_STALE_S) -> list[int]:
    """Trials left RUNNING by a controller that died: kill what is left of them, mark them FAIL (stale),
    and re-enqueue a lost baseline or warm start so the study still gets one."""
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = TrialRecord.from_frozen(t)
        owner = record.owner
        if owner is None:
            started = t.datetime_start.timestamp() if t.datetime_start else 0.0
            if time.time() - started <= ownerless_after_s:
                continue
            why = "its controller died before recording itself as the owner"
        else:
            if _owner_alive(owner):
                continue
            if owner.get("host") == socket.gethostname():  # reap the orphaned trial's groups: torchrun's, its ranks'
                signal_groups([g for g in (owner.get("pgid"), *owner.get("pgids", ())) if g])
            why = f"controller pid {owner.get('pid')} on {owner.get('host')} died"
        records.fail_other(study, t, Reason.STALE, why)
        if record.role in (Role.BASELINE, Role.WARM_START):
            records.enqueue(study, t.params, TrialRecord(role=record.role, config=record.config))
        failed.append(t.number)
    return failed
