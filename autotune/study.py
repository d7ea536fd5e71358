"""The search: open the study, enqueue baseline and warm start, then ask -> run -> tell until the budget."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread, is_heartbeat_enabled  # what Study.optimize uses
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.trial import FrozenTrial, TrialState

from autotune import launcher
from autotune.config import BASELINE, KNOBS, SearchSettings, TrialConfig, TrialResult
from autotune.errors import AutotuneError, TrialBadConfig, TrialFailure, TrialNumerics, TrialOOM, TrialPruned, TrialUnsupported
from autotune.fingerprint import differences
from autotune.locks import Lease, device_lock
from autotune.warm import WarmServer
from autotune.search_space import Choices, Hardware, SearchSpace, suggest

# We run ask/tell ourselves, with the heartbeat thread Study.optimize would start: the warning is moot.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

# The sampler should learn where these lie: they are properties of the config, not accidents.
INFEASIBLE = (TrialOOM, TrialNumerics, TrialUnsupported, TrialBadConfig)
FEASIBLE_KEY = "infeasible"


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=6)
    # constant_liar keeps concurrent workers from proposing the same config.
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=6)


def make_pruner() -> optuna.pruners.BasePruner:
    # Steps are throughput windows. Prune a trial in the slowest quarter at the same window,
    # once a few trials exist to compare with; the first window is warm-up-noisy, so skip it.
    return optuna.pruners.PercentilePruner(25.0, n_startup_trials=4, n_warmup_steps=1)


def warm_start(base: TrialConfig, hw: Hardware) -> TrialConfig:
    """The published guides' recommendation: workers = cores, pinned, AMP, fused AdamW, cudnn.benchmark."""
    bf16 = not hw.cuda or _bf16_supported()
    return base.replace(num_workers=max(1, hw.cpu_count), pin_memory=hw.cuda, precision="bf16" if bf16 else "fp16",
                        optimizer_fusion="fused", cudnn_benchmark=hw.cuda, persistent_workers=True,
                        prefetch_factor=2, set_to_none=True)


def _bf16_supported() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def open_study(settings: SearchSettings, storage: Any, fp: dict[str, Any], space: SearchSpace,
               hw: Hardware) -> optuna.Study:
    """Create the study, or resume it if its fingerprint matches this machine (or --force)."""
    sampler, pruner = make_sampler(settings.sampler, settings.seed), make_pruner()
    try:
        study = optuna.create_study(study_name=settings.study, storage=storage, direction="maximize",
                                    sampler=sampler, pruner=pruner)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=settings.study, storage=storage, sampler=sampler, pruner=pruner)
        recorded = study.user_attrs.get("fingerprint")
        diff = differences(recorded, fp) if recorded else []  # empty: its creator is still writing it
        if diff and not settings.force:
            raise AutotuneError(f"study {settings.study!r} was measured on another setup ({'; '.join(diff)}); "
                                "its timings are not comparable. Use --force to resume anyway, or a new --study")
        fail_stale(study, storage)
        return study
    # Only the process that created the study enqueues: concurrent starts can't duplicate the baseline.
    study.set_user_attr("fingerprint", fp)
    study.set_user_attr("space", space.to_dict())
    study.set_user_attr("workload", settings.base.workload())
    study.set_user_attr("sampler", settings.sampler)
    # Trial 0 is the baseline, trial 1 the guides' warm start.
    for role, cfg in (("baseline", settings.base.replace(**BASELINE.knobs())), ("warm_start", warm_start(settings.base, hw))):
        study.enqueue_trial(_params(cfg, space), user_attrs={"role": role, "config": cfg.knobs()}, skip_if_exists=True)
    return study


STALE_AFTER_S = 600.0  # a trial on another host with no heartbeat for this long is presumed dead


def _owner_alive(owner: dict[str, Any]) -> bool:
    import psutil

    if owner.get("host") != socket.gethostname():
        return time.time() - float(owner.get("heartbeat", owner.get("started", 0))) < STALE_AFTER_S
    try:  # same host: the owning controller is alive iff its pid exists and is not a reused pid
        return psutil.Process(owner["pid"]).create_time() <= owner["started"] + 1
    except (psutil.NoSuchProcess, KeyError):
        return False


def fail_stale(study: optuna.Study, storage: Any) -> list[int]:
    """Trials left RUNNING by a controller that died: kill what is left of them, mark them FAIL (stale),
    and re-enqueue a lost baseline or warm start so the study still gets one."""
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        if not owner or _owner_alive(owner):
            continue
        if owner.get("host") == socket.gethostname() and owner.get("pgid"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(owner["pgid"], signal.SIGKILL)  # reap an orphaned trial process group
        storage.set_trial_user_attr(t._trial_id, "reason", "stale")
        storage.set_trial_user_attr(t._trial_id, "message", f"controller pid {owner.get('pid')} on {owner.get('host')} died")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.user_attrs.get("role") in ("baseline", "warm_start"):
            study.enqueue_trial(t.params, user_attrs={"role": t.user_attrs["role"], "config": t.user_attrs["config"]})
        failed.append(t.number)
    return failed


def _params(cfg: TrialConfig, space: SearchSpace) -> dict[str, Any]:
    """Params for the knobs of `cfg` the space can express. Optuna refuses an enqueued choice
    outside the list, so those are left to the sampler; the trial still runs `cfg` (user attr)."""
    params: dict[str, Any] = {}
    for knob in space.searched():
        spec, value = space[knob], getattr(cfg, knob)
        if isinstance(spec, Choices) and value not in spec.values:
            continue
        if knob in ("prefetch_factor", "persistent_workers") and cfg.num_workers == 0:
            continue
        params[knob] = value
    return params


def config_for(trial: optuna.Trial, space: SearchSpace, base: TrialConfig) -> TrialConfig:
    cfg = suggest(trial, space, base)
    fixed = trial.user_attrs.get("config")  # baseline / warm start run exactly as enqueued
    return cfg.replace(**fixed) if fixed else cfg


def study_workload(study: optuna.Study, data: str | None, studies_dir: str) -> TrialConfig:
    """The study's workload on this machine. --data wins; a missing default synthetic set is
    regenerated (it is deterministic, so the files are identical); other missing data is bad input."""
    from autotune.data import default_data

    if "workload" not in study.user_attrs:
        raise AutotuneError(f"study {study.study_name!r} was not made by `autotune search` (no workload attr)")
    work = TrialConfig.from_dict(study.user_attrs["workload"])
    if data:
        return work.replace(data_dir=str(Path(data).resolve()))
    if work.data_dir and not Path(work.data_dir).exists():
        if not Path(work.data_dir).name.startswith("synthetic-"):
            raise AutotuneError(f"the study's data {work.data_dir} is not on this machine; pass --data DIR")
        work = work.replace(data_dir=str(default_data(studies_dir)))
    return work


# ---- results ---------------------------------------------------------------------------------

def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and t.value is not None and all(v <= 0 for v in t.constraints.values())


def leaderboard(study: optuna.Study) -> list[FrozenTrial]:
    return sorted((t for t in study.get_trials(deepcopy=False) if feasible(t)), key=lambda t: -float(t.value or 0))


def baseline_sps(study: optuna.Study) -> float | None:
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("role") == "baseline" and feasible(t):
            return float(t.value or 0)
    return None


# ---- the loop --------------------------------------------------------------------------------

@dataclass
class Events:
    """Hooks for the live display; every one is optional."""

    started: Callable[[int, str, TrialConfig], None] = lambda n, role, cfg: None
    window: Callable[[float], None] = lambda sps: None
    finished: Callable[[FrozenTrial], None] = lambda t: None


def run_search(study: optuna.Study, space: SearchSpace, settings: SearchSettings, events: Events,
               server: WarmServer | None = None) -> int:
    """ask -> run -> tell until the budget or --n-trials is spent. Returns the trials run."""
    deadline = time.monotonic() + settings.budget_s
    grace = max(30.0, 0.02 * settings.budget_s) - 10.0  # leave room to export inside the promise
    durations: list[float] = []
    ran = 0
    while settings.n_trials is None or ran < settings.n_trials:
        left = deadline - time.monotonic()
        # Don't start what we don't expect to finish: the median trial so far is the estimate.
        if left <= 0 or (durations and statistics.median(durations) > left + grace):
            break
        if is_heartbeat_enabled(study._storage):
            optuna.storages.fail_stale_trials(study)  # a dead worker's trial: FAIL, then retried
        else:
            fail_stale(study, study._storage)  # journal: owner pid/host/heartbeat in user attrs
        trial = study.ask()
        cfg = config_for(trial, space, settings.base)
        t0 = time.monotonic()
        frozen = run_one(study, trial, cfg, settings, min(settings.trial_timeout, left + grace), events, server)
        durations.append(time.monotonic() - t0)
        events.finished(frozen)
        ran += 1
    return ran


def run_one(study: optuna.Study, trial: optuna.Trial, cfg: TrialConfig, settings: SearchSettings,
            timeout_s: float, events: Events, server: WarmServer | None = None) -> FrozenTrial:
    role = trial.user_attrs.get("role", "search")
    events.started(trial.number, role, cfg)
    trial_dir = Path(settings.studies_dir) / settings.study / f"trial-{trial.number}"
    trial.set_user_attr("role", role)
    trial.set_user_attr("config", cfg.knobs())
    trial.set_user_attr("owner", {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})

    beat = [time.time()]

    windows = [0]

    def on_window(step: int, sps: float) -> bool:
        # Report by window index, not step count: pruning compares trials at the same point in
        # their measurement, whatever their batch size or window length.
        trial.report(sps, windows[0])
        windows[0] += 1
        if time.time() - beat[0] > 30:  # heartbeat for searches on other hosts sharing the study
            beat[0] = time.time()
            trial.set_user_attr("owner", {**trial.user_attrs["owner"], "heartbeat": beat[0]})
        events.window(sps)
        return role == "search" and trial.should_prune()

    def on_start(pgid: int) -> None:
        trial.set_user_attr("owner", {**trial.user_attrs["owner"], "pgid": pgid})

    state, value = TrialState.COMPLETE, None
    lease = Lease()
    try:
        # RDB storages: the heartbeat thread Study.optimize would run, so other workers see we're alive.
        with get_heartbeat_thread(trial._trial_id, study._storage), device_lock(cfg.gpus) as lease:
            result = launcher.run_trial(cfg, trial_dir, timeout_s, on_window, on_start=on_start, server=server)
    except TrialPruned as e:
        _record_failure(trial, e)
        state = TrialState.PRUNED
    except INFEASIBLE as e:
        # Recorded as complete but infeasible: Optuna's samplers steer away, and it is never "best".
        _record_failure(trial, e)
        trial.set_constraint(FEASIBLE_KEY, 1.0)
        value = 0.0
    except TrialFailure as e:
        _record_failure(trial, e)
        state = TrialState.FAIL
    except BaseException:
        trial.set_user_attr("reason", "interrupted")
        _upload(study, trial, trial_dir)
        study.tell(trial, state=TrialState.FAIL)
        raise
    else:
        trial.set_constraint(FEASIBLE_KEY, 0.0)
        if lease.contended:  # another trial shared these cores: the figure is suspect
            trial.set_user_attr("contended", True)
        _record_result(study, trial, result)
        value = result.samples_per_s
    _upload(study, trial, trial_dir)
    return study.tell(trial, value, state=state if value is None else None)


def _record_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
    for k, v in result.metrics().items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("applied", dict(result.applied))
    trial.set_user_attr("windows", list(result.windows))
    base = result.samples_per_s if trial.user_attrs.get("role") == "baseline" else baseline_sps(study)
    if base and result.samples_per_s:
        trial.set_user_attr("speedup", result.samples_per_s / base)


def _record_failure(trial: optuna.Trial, e: TrialFailure) -> None:
    trial.set_user_attr("reason", e.reason)
    trial.set_user_attr("message", str(e)[:500])
    trial.set_user_attr("windows", list(e.partial.get("windows", [])))
    trial.set_user_attr("log_tail", e.log_tail[-4000:] or "(the trial printed nothing)")


def artifact_dir(settings: SearchSettings) -> Path:
    return Path(settings.studies_dir) / "artifacts"


def _upload(study: optuna.Study, trial: optuna.Trial, trial_dir: Path) -> None:
    """config, result and log as Optuna artifacts: `optuna-dashboard studies.db --artifact-dir studies/artifacts`."""
    store_dir = trial_dir.parent.parent / "artifacts"
    store_dir.mkdir(parents=True, exist_ok=True)
    store = FileSystemArtifactStore(str(store_dir))
    for name in ("config.json", "result.json", "trial.log", "profile.txt"):
        path = trial_dir / name
        if path.is_file():
            upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial)
