"""The last step of a search: how far the exported config is from the limit. Its compute-only rate (the
data-bound ceiling) and its model FLOPs utilisation, measured once in a fresh process
(autotune/trial/probes/ceiling.py) when the budget left pays for it, kept on the study with the trial it measured
(records.ceiling), and so in every export of that trial: best.yaml's `ceiling:` section.
Skipped with the reason otherwise.

May import: autotune.core, autotune.trial, and the rest of autotune.search (never the session).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from autotune.core.config import TrialConfig
from autotune.core.settings import SearchSettings
from autotune.search.budget import Budget
from autotune.search.loop.runner import contended_cpus
from autotune.search.store.folders import end_folder
from autotune.search.store import records
from autotune.search.store.records import StudyRecord, TrialRecord
from autotune.search.store.results import exported
from autotune.trial.probes import ceiling as measuring

# A fresh process's imports and pipeline build before its first step (the Unet's is ~5 s cold on the
# 2-core CPU, ARCHITECTURE's table); the measured steps are added from the exported trial's step time.
START_S = 8.0
# Steps the measurement takes beside its timed ones: the untimed first, the counted one, and the cached
# batches taken from the loader.
EXTRA_STEPS = 2 + measuring.CACHED_BATCHES


def need_s(record: TrialRecord) -> float:
    """About how long the measurement of `record`'s config takes, from its own measured step time."""
    step = float(record.metrics.get("step_time_p50") or 0.0)
    timed = 2 * measuring.ROUNDS * max(measuring.PHASE_S, measuring.MIN_STEPS * step)
    ahead = TrialConfig.from_dict(record.config).batches_ahead
    warm = measuring.ROUNDS * max(1, ahead)  # before each loader phase (trial/probes/ceiling.py)
    return START_S + timed + (EXTRA_STEPS + warm) * step + measuring.PROBE_S + measuring.PROBE_TARGET_S * 4


def run(
    study: optuna.Study, settings: SearchSettings, budget: Budget | None, *, say: Callable[[str], None] = print
) -> dict[str, Any] | None:
    """Measure the exported config's ceiling if the budget left to its late end pays for it; the section
    stored on the study (skipped: its reason), or None when nothing is exported."""
    best = exported(study)
    if best is None:
        return None
    record = TrialRecord.from_frozen(best)
    ran = TrialConfig.from_dict({**(StudyRecord.of(study).workload or {}), **record.config})
    # The compute-only step is one process's; the config's per-GPU rate is the ceiling's.
    cfg = ran.one_process()
    need = need_s(record)
    deadline = budget.ceiling_end if budget else None
    reason = measuring.why_not(cfg)
    if reason is None and not Budget.fits(need, deadline):
        left = max(0.0, deadline - time.monotonic()) if deadline is not None else float("inf")
        reason = f"the budget left ({left:.0f} s) cannot pay for it (about {need:.0f} s)"
    if reason is not None:
        section: dict[str, Any] = {"skipped": reason}
    else:
        timeout = (deadline - time.monotonic()) if deadline is not None else 4 * need
        say(f"ceiling: measuring trial {best.number}'s compute-only rate and FLOPs utilisation (about {need:.0f} s)")
        section = measuring.run_ceiling(cfg, end_folder(settings, study, "ceiling"), timeout)
    others = section.get("others_cpu")
    if others is not None:  # a figure another process starved is not the config's, as for a trial
        section["contended"] = others > contended_cpus()
    if ran.gpus > 1:
        section["note"] = f"measured on one of the config's {ran.gpus} GPUs"
    records.write_ceiling(study, best.number, section)
    say(f"ceiling: {summary(section)}")
    return section


def summary(section: Mapping[str, Any]) -> str:
    """One line: the ceiling and the utilisation, or why there are none."""
    if section.get("skipped"):
        return f"not measured: {section['skipped']}"
    comp, e2e = section.get("compute_only_samples_per_s"), section.get("end_to_end_samples_per_s")
    line = (
        f"compute-only {comp:.2f} samples/s vs end-to-end {e2e:.2f} in the same process: "
        f"{section.get('lost_to_data_wait', 0.0):.0%} lost to data wait"
    )
    if section.get("utilisation") is not None:
        line += (
            f"; model FLOPs utilisation {section['utilisation']:.1%} of a probed "
            f"{section['peak_flops_per_s'] / 1e9:.1f} GFLOP/s {section.get('peak_dtype', '')} peak"
        )
    else:
        line += f"; no FLOPs utilisation: {section.get('utilisation_not_counted', 'not counted')}"
    if section.get("contended"):
        line += f" (contended: other processes kept {section['others_cpu']:.1f} CPUs busy meanwhile)"
    return line
