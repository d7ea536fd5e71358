"""The study a search runs in: its sampler and pruner, created or resumed (the baseline and the warm
start enqueued once), loaded again by name, its workload on this machine, and a suggested trial as a
TrialConfig."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna

from autotune import pipelines
from autotune.core import knobs as described
from autotune.core.config import TrialConfig, baseline_of, inert
from autotune.core.knobs.row import Guided
from autotune.core.settings import SearchSettings
from autotune.core.errors import AutotuneError
from autotune.core.outcomes import Role
from autotune.search.store import records
from autotune.search.space.machine import differences
from autotune.search.store.records import StudyRecord, TrialRecord
from autotune.search.store.storage import shown_storage
from autotune.search.space.spec import Fixed, SearchSpace, spec_values
from autotune.search.space.machine import Hardware
from autotune.search.space.suggest import config_params, suggest
from autotune.search.store.storage import open_storage
from autotune.search.loop.strategy import CoordinateSampler, make_tpe

# We run ask/tell ourselves, with the heartbeat thread Study.optimize would start: the warning is moot.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

OBJECTIVE = "samples_per_s"  # what optuna-dashboard labels its plots with


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "auto":  # a coordinate pass from the best config so far, then TPE (search/loop/strategy.py)
        return CoordinateSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=6)
    return make_tpe(seed)


def make_pruner() -> optuna.pruners.BasePruner:
    # Steps are throughput windows. Prune a trial in the slowest quarter at the same window, once a few
    # trials exist to compare with; the first window is warm-up-noisy, so skip it. Optuna's percentile is
    # the share KEPT ("given 25.0, top of 25th percentile trials are kept"): 75 keeps all but the slowest
    # quarter. 25 kept only the fastest quarter: most trials were cut after two short windows of noise.
    return optuna.pruners.PercentilePruner(75.0, n_startup_trials=4, n_warmup_steps=1)


def warm_start(base: TrialConfig, hw: Hardware, space: SearchSpace | None = None) -> TrialConfig:
    """The published guides' recommendation (each knob's `guide`): workers = cores, pinned, AMP, fused AdamW,
    cudnn.benchmark.

    Cores are the usable ones (affinity, cgroup quota) shared by the trial's processes, one per GPU, as a
    count the space allows. A knob the space fixes keeps its fixed value (this machine cannot vary it, or the
    pipeline cannot take it: a script that never calls at.autocast(), a Lightning module's own optimizer), and
    one whose guide the space does not hold (fp16 for a script that hands over no GradScaler) the baseline's:
    the guide's value would only be refused. Dependents not in effect (no workers: no persistence) are left
    at their defaults."""
    bf16 = _bf16_supported(base.gpus) if hw.cuda else hw.cpu_bf16
    workers = hw.workers_per_process(base.gpus, space.knobs.get("num_workers") if space else None)
    own = baseline_of(base)
    guide = described.guides(Guided(cuda=hw.cuda, bf16=bf16, workers=workers))
    for k, spec in space.knobs.items() if space is not None else ():
        if k in guide and isinstance(spec, Fixed):
            guide[k] = spec.value
        elif k in guide and guide[k] not in spec_values(spec):
            guide[k] = getattr(own, k)
    values = {**own.knobs(), **guide}
    return own.replace(**(guide | inert(values)))


def _bf16_supported(gpus: int = 1) -> bool:
    """torch.cuda.is_bf16_supported(including_emulation=False) for the trial's GPUs (compute capability
    >= 8.0), asked of NVML: torch's answer would create a CUDA context in this controller process (it
    reads the device properties), and its default also counts emulation, so says True on a V100 or T4,
    where bf16 is emulated and slow. Without NVML: fp16, which autocast runs on every CUDA GPU."""
    from autotune.trial.measurement.measure import nvml, visible_handles  # lazy: torch; `show` loads studies without it

    pynvml = nvml()
    if pynvml is None:
        return False
    try:
        handles = visible_handles(pynvml)[: max(1, gpus)]
        caps = []
        for h in handles:
            try:
                caps.append(tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)))
            except pynvml.NVMLError:  # a MIG slice: its GPU's capability
                caps.append(
                    tuple(
                        pynvml.nvmlDeviceGetCudaComputeCapability(
                            pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
                        )
                    )
                )
    except Exception:
        return False
    return bool(caps) and min(caps) >= (8, 0)


def open_study(
    settings: SearchSettings, storage: Any, fp: dict[str, Any], space: SearchSpace, hw: Hardware | None
) -> optuna.Study:
    """Create the study, or resume it if its fingerprint matches this machine (or --force).

    hw=None (`search --create-only`): the study is made on a host that may be unlike the workers (a
    CPU-only database server), so the space is stored as written and the first worker resolves it
    against its own hardware, records its fingerprint and enqueues the baseline and warm start."""
    sampler, pruner = make_sampler(settings.sampler, settings.seed), make_pruner()
    try:
        study = optuna.create_study(
            study_name=settings.study, storage=storage, direction="maximize", sampler=sampler, pruner=pruner
        )
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=settings.study, storage=storage, sampler=sampler, pruner=pruner)
        recorded = StudyRecord.of(study).fingerprint
        diff = differences(recorded, fp) if recorded else []  # empty: its creator is still writing it
        if diff and not settings.force:
            raise AutotuneError(
                f"study {settings.study!r} was measured on another setup ({'; '.join(diff)}); "
                "its timings are not comparable. Use --force to resume anyway, or a new --study"
            ) from None
        return study  # trials a dead controller left running are failed by the loop, before each ask
    # Only the process that created the study enqueues: concurrent starts can't duplicate the baseline.
    with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([OBJECTIVE])
    StudyRecord(
        fingerprint=fp if hw else {},
        space=space.to_dict(),
        workload=settings.base.workload(),
        sampler=settings.sampler,
        trial_timeout_s=settings.trial_timeout,
        resolved=hw is not None,
        memory_headroom=settings.memory_headroom,
        parity_steps=settings.parity_steps,
        confirm_rounds=settings.confirm_rounds,
        confirm_top=settings.confirm_top,
    ).write(study)
    if hw is not None:
        enqueue_starts(study, settings.base, space, hw)
    return study


def enqueue_starts(study: optuna.Study, base: TrialConfig, space: SearchSpace, hw: Hardware) -> None:
    """Trial 0 is the baseline, trial 1 the guides' warm start. skip_if_exists: two first workers of a
    deferred study that race here don't queue them twice."""
    for role, cfg in ((Role.BASELINE, baseline_of(base)), (Role.WARM_START, warm_start(base, hw, space))):
        record = TrialRecord(role=role, config=cfg.knobs())
        records.enqueue(study, config_params(cfg, space), record, skip_if_exists=True)


def config_for(trial: optuna.Trial, space: SearchSpace, base: TrialConfig) -> TrialConfig:
    cfg = suggest(trial, space, base)
    fixed = TrialRecord.of(trial).knob_values()  # baseline / warm start run exactly as enqueued
    return cfg.replace(**fixed) if fixed else cfg


def study_workload(study: optuna.Study, data: str | None, studies_dir: str) -> TrialConfig:
    """The study's workload on this machine. --data wins; a missing default synthetic set is
    regenerated (it is deterministic, so the files are identical); other missing data is bad input."""
    workload = StudyRecord.of(study).workload
    if workload is None:
        raise AutotuneError(f"study {study.study_name!r} was not made by `autotune search` (no workload attr)")
    work = TrialConfig.from_dict(workload)
    if data:
        return work.replace(data_dir=str(Path(data).resolve()))
    if work.data_dir and not Path(work.data_dir).exists():
        if not pipelines.is_regenerable(work.data_dir):
            raise AutotuneError(f"the study's data {work.data_dir} is not on this machine; pass --data DIR")
        work = work.replace(data_dir=pipelines.default_data(work.pipeline, studies_dir))
    return work


def load_study(storage_url: str | None, name: str) -> optuna.Study:
    """An existing study, with the sampler it was created with; a missing one is bad input naming those there."""
    storage = open_storage(storage_url)
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if name not in summaries:
        raise AutotuneError(
            f"no study {name!r} in {shown_storage(storage_url)} (studies there: {', '.join(summaries) or 'none'})"
        )
    sampler = make_sampler(StudyRecord.of(summaries[name]).sampler, None)
    return optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=make_pruner())
