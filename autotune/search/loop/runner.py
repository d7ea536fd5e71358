"""One trial of a search: launch it, classify how it ended, and tell the study, with its record,
artifacts and constraint (infeasible configs are constraints, so the sampler steers away)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import FrozenTrial, TrialState

from autotune.core.config import TrialConfig
from autotune.core.result import TrialResult
from autotune.core.settings import SearchSettings
from autotune.core.errors import (
    TrialBadConfig,
    TrialFailure,
    TrialNumerics,
    TrialOOM,
    TrialPruned,
    TrialTimeout,
    TrialUnsupported,
)
from autotune.search.store import _optuna
from autotune.search.store.folders import trial_dir
from autotune.trial.processes.locks import locked_trial
from autotune.search.store.records import FEASIBLE_KEY, TrialRecord, of_result, write, write_owner, write_reason
from autotune.search.store.results import baseline_sps
from autotune.search.store.telling import tell
from autotune.search.space.machine import usable_cpus
from autotune.core.files import disk_error
from autotune.core.outcomes import Reason, Role
from autotune.trial.processes.warm_client import WarmServer

# The sampler should learn where these lie: they are properties of the config, not accidents.
INFEASIBLE = (TrialOOM, TrialNumerics, TrialUnsupported, TrialBadConfig)
# Other processes' CPU use during a trial's timed window, on the CPUs it was allotted (/proc/stat less
# the trial's own tree), above which its figure is not the config's speed: a quarter of a core on a
# 2-CPU machine (one busy core there makes a step many times slower: benchmarks/README.md), an eighth
# of the share on a larger one, where a neighbour's steady fraction of a core is noise.
CONTENDED_SHARE = 0.125


def contended_cpus() -> float:
    """The threshold in CPUs for this process's allotment (its trials inherit the affinity)."""
    return CONTENDED_SHARE * usable_cpus()


@dataclass
class Events:
    """Hooks for the live display; every one is optional."""

    started: Callable[[int, str, TrialConfig], None] = lambda n, role, cfg: None
    window: Callable[[float], None] = lambda sps: None
    finished: Callable[[FrozenTrial], None] = lambda t: None


def run_one(
    study: optuna.Study,
    trial: optuna.Trial,
    cfg: TrialConfig,
    settings: SearchSettings,
    timeout_s: float,
    events: Events,
    server: WarmServer | None = None,
) -> FrozenTrial:
    """Run `cfg` as `trial` and tell the study how it went: its figures, or why it failed."""
    role = TrialRecord.of(trial).role
    events.started(trial.number, role, cfg)
    folder = trial_dir(settings, trial.number)
    # A trial that carries its class's check (search/checks/riding.py) is not pruned before its verdict.
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    watch = _Watch(trial, role, owner, events, carries=cfg.record_steps > 0)
    write(trial, TrialRecord(role=role, config=cfg.knobs(), owner=watch.owner))
    launched = time.monotonic()
    try:
        # RDB storages: the heartbeat thread Study.optimize would run, so other workers see we're alive.
        with _optuna.heartbeat_thread(study, trial):
            result, lease = locked_trial(
                cfg,
                folder,
                timeout_s,
                on_window=watch.window,
                on_start=watch.started,
                server=server,
                on_groups=watch.groups,
            )
    except TrialFailure as e:
        write(trial, TrialRecord(role=role, wall_s=round(time.monotonic() - launched, 2)))
        state, value = _failed(trial, role, cfg, e, budget_cut=timeout_s < settings.trial_timeout)
    except OSError as e:
        if not disk_error(e):
            raise
        # A full or read-only disk: record why if the journal still takes a write, then stop the search.
        with contextlib.suppress(OSError):
            write(trial, TrialRecord(role=role, reason=Reason.DISK, message=f"{e.strerror or e}: {e.filename or ''}"))
            tell(study, trial, state=TrialState.FAIL)
        raise
    except BaseException:
        write_reason(trial, Reason.INTERRUPTED)
        _upload(trial, folder)
        tell(study, trial, state=TrialState.FAIL)
        raise
    else:
        # The wall time beside the cost estimate made before launch (search/loop/cost.py reads it back).
        write(trial, TrialRecord(role=role, wall_s=round(time.monotonic() - launched, 2)))
        state, value = TrialState.COMPLETE, _measured(study, trial, role, cfg, result, settings, lease.contended)
    _upload(trial, folder)
    return tell(study, trial, value, state=state if value is None else None)


@dataclass
class _Watch:
    """The launcher's callbacks for a running trial: pruning reports, the owner's heartbeat and groups."""

    trial: optuna.Trial
    role: str
    owner: dict[str, Any]  # controller pid/host/started, then its heartbeat and the trial's process groups
    events: Events
    carries: bool = False  # it records the losses of its class's check: never pruned before its verdict
    beat: float = field(default_factory=time.time)
    windows: int = 0

    def window(self, step: int, sps: float) -> bool:
        # Report by window index, not step count: pruning compares trials at the same point in
        # their measurement, whatever their batch size or window length.
        self.trial.report(sps, self.windows)
        self.windows += 1
        if time.time() - self.beat > 30:  # heartbeat for searches on other hosts sharing the study
            self.beat = time.time()
            self.owner["heartbeat"] = self.beat
            write_owner(self.trial, self.owner)
        self.events.window(sps)
        return self.role == Role.SEARCH and not self.carries and self.trial.should_prune()

    def started(self, pgid: int) -> None:
        self.owner["pgid"] = pgid
        write_owner(self.trial, self.owner)

    def groups(self, pgids: list[int]) -> None:  # torchrun's ranks lead their own groups: a resume kills those too
        self.owner["pgids"] = pgids
        write_owner(self.trial, self.owner)


def _failed(
    trial: optuna.Trial, role: str, cfg: TrialConfig, e: TrialFailure, budget_cut: bool
) -> tuple[TrialState, float | None]:
    """(state, value) for a trial that failed with `e`, its failure recorded."""
    if isinstance(e, TrialTimeout):
        return _timed_out(trial, role, cfg, e, budget_cut)
    _record_failure(trial, role, e)
    if isinstance(e, TrialPruned):
        return TrialState.PRUNED, None
    if isinstance(e, INFEASIBLE):
        # Recorded as complete but infeasible: Optuna's samplers steer away, and it is never "best".
        trial.set_constraint(FEASIBLE_KEY, 1.0)
        return TrialState.COMPLETE, 0.0
    return TrialState.FAIL, None


def _timed_out(
    trial: optuna.Trial, role: str, cfg: TrialConfig, e: TrialTimeout, budget_cut: bool
) -> tuple[TrialState, float | None]:
    """(state, value) for a trial that timed out: a FAIL, or infeasible when a compilation could not
    finish within the trial timeout (a property of the config: as a FAIL, TPE would retry it)."""
    if not compiling(cfg, e):
        _record_failure(trial, role, e)
        return TrialState.FAIL, None
    if budget_cut:
        # The budget's end, not the trial timeout, cut the compilation short: that says nothing about
        # the config, so a FAIL (never reused, tried again by a later or resumed search).
        _record_failure(
            trial,
            role,
            TrialTimeout(f"the search's budget ended during torch.compile's warm-up: {e}", e.log_tail, e.partial),
        )
        write_reason(trial, Reason.BUDGET)
        return TrialState.FAIL, None
    _record_failure(
        trial,
        role,
        TrialTimeout(
            f"torch.compile ({cfg.compile}) had not finished its warm-up steps when the trial timed out: {e}",
            e.log_tail,
            e.partial,
        ),
    )
    write_reason(trial, Reason.COMPILE_TIMEOUT)
    trial.set_constraint(FEASIBLE_KEY, 1.0)
    return TrialState.COMPLETE, 0.0


def _measured(
    study: optuna.Study,
    trial: optuna.Trial,
    role: str,
    cfg: TrialConfig,
    result: TrialResult,
    settings: SearchSettings,
    shared: bool,
) -> float:
    """Record a finished trial's figures; its objective value (0 when it breaks the memory headroom)."""
    base = result.samples_per_s if role == Role.BASELINE else baseline_sps(study)
    speedup = result.samples_per_s / base if base and result.samples_per_s else None
    # Another trial shared these cores (lease), or other processes kept the CPU busy: suspect. The
    # search measures it once more (session.py), and it ranks below every clean figure meanwhile.
    contended = shared or (result.others_cpu or 0.0) > contended_cpus()
    write(trial, of_result(role, cfg, result, speedup, contended))
    short = headroom_short(result, settings.memory_headroom)
    if short and role == Role.BASELINE:
        # The reference every speedup divides by: always measured and reported, never dropped. Said.
        write(
            trial, TrialRecord(role=role, reason=Reason.HEADROOM, message=f"the baseline breaks the headroom: {short}")
        )
        short = None
    # Too close to the memory limit: it ran here, but a longer run (a bigger batch late in an epoch,
    # fragmentation, another process) would fail. Infeasible, like an OOM, and never exported.
    trial.set_constraint(FEASIBLE_KEY, 1.0 if short else 0.0)
    if short:
        write(trial, TrialRecord(role=role, reason=Reason.HEADROOM, message=short))
    return 0.0 if short else float(result.samples_per_s or 0.0)


def headroom_short(result: TrialResult, required: float) -> str | None:
    """Why `result` leaves less than `required` of its memory free, or None when it leaves enough (or
    the total is unknown)."""
    peak, total = result.peak_memory_bytes, result.memory_total_bytes
    if not peak or not total or required <= 0:
        return None
    free = 1 - peak / total
    if free >= required:
        return None
    where = "device memory" if result.device != "cpu" else "available RAM"
    return (
        f"peak {peak / 2**20:.0f} MiB of {total / 2**20:.0f} MiB {where} leaves {free:.1%} free, "
        f"less than the {required:.0%} headroom required (--memory-headroom)"
    )


def compiling(cfg: TrialConfig, e: TrialTimeout) -> bool:
    """A timeout before the first measured window of a compiled config: compilation ate the allowance."""
    return cfg.compile != "off" and not e.partial.get("windows")


def _record_failure(trial: optuna.Trial, role: str, e: TrialFailure) -> None:
    write(
        trial,
        TrialRecord(
            role=role,
            reason=e.reason,
            message=str(e)[:500],
            windows=tuple(e.partial.get("windows", [])),
            log_tail=e.log_tail[-4000:] or "(the trial printed nothing)",
        ),
    )


def _upload(trial: optuna.Trial, trial_dir: Path) -> None:
    """config, result and log as Optuna artifacts: `optuna-dashboard studies.db --artifact-dir studies/artifacts`."""
    store_dir = trial_dir.parent.parent / "artifacts"
    store_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(str(store_dir))
    for name in ("config.json", "result.json", "trial.log", "profile.txt"):
        path = trial_dir / name
        if path.is_file():
            upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial)
