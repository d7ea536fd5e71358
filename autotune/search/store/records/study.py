"""The study's own record in its user attrs: written once by the process that creates it (the fingerprint,
space, workload, settings), then the few parts later runs add alone (a rebase, the model facts, why a run
stopped, the baseline's further draws).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

import optuna
from optuna.study import StudySummary


@dataclass(frozen=True)
class StudyRecord:
    """A study's user attrs, written once by the process that creates it; workers read them."""

    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    space: Mapping[str, Any] | None = None
    workload: Mapping[str, Any] | None = None
    sampler: str = "tpe"
    trial_timeout_s: float | None = None
    resolved: bool = True  # False: made by `search --create-only`; the first worker resolves the space
    memory_headroom: float | None = None  # the share of memory a config must leave free (workers too)
    parity_steps: int | None = None
    confirm_rounds: int | None = None  # the search's confirmation, run by the worker that finishes last
    confirm_top: int | None = None
    ablation: list[Any] | None = None  # `autotune ablate`'s steps (apply/ablate.py), written by write_ablation
    model_facts: Mapping[str, Any] | None = None  # memory.ModelFacts.to_dict(), probed once; write_model_facts
    # Why the last run's trial loop ended (search/loop/session.py's Stop, its word); write_stop_reason
    stop_reason: str | None = None

    @classmethod
    def of(cls, study: optuna.Study | StudySummary) -> StudyRecord:
        """The record of a study, or of a study summary (optuna.get_all_study_summaries)."""
        attrs = study.user_attrs
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in attrs.items() if k in names})

    def write(self, study: optuna.Study) -> None:
        for key, value in dataclasses.asdict(self).items():
            if value is not None:
                study.set_user_attr(key, value)


def write_rebased(study: optuna.Study, workload: Mapping[str, Any], space: Mapping[str, Any]) -> None:
    """The study's workload and space once trial 0 showed the script's own batch (search/loop/session.py): the
    workers that join from here read the baseline and the space the rest of the search runs."""
    study.set_user_attr("workload", dict(workload))
    study.set_user_attr("space", dict(space))


def write_ablation(study: optuna.Study, steps: list[Any]) -> None:
    """`autotune ablate`'s steps alone (StudyRecord.write would write every field)."""
    study.set_user_attr("ablation", steps)


def write_model_facts(study: optuna.Study, facts: Mapping[str, Any]) -> None:
    """The memory estimate's model facts alone, as the process that probed them measured them."""
    study.set_user_attr("model_facts", dict(facts))


def write_stop_reason(study: optuna.Study, stop: str) -> None:
    """Why a run's trial loop ended, alone: each run of the study (a resumed search, a fleet's worker)
    writes its own, so the study holds the last one's."""
    study.set_user_attr("stop_reason", str(stop))


DRAWS = "baseline_draws"  # the baseline's further draws, each in its own process (search/loop/draws.py)


def baseline_draws(study: optuna.Study | StudySummary) -> list[float]:
    """The samples/s of each further draw of the baseline; [] when none was made."""
    value = study.user_attrs.get(DRAWS)
    return [float(x) for x in value if isinstance(x, (int, float))] if isinstance(value, list) else []


def write_baseline_draw(study: optuna.Study, samples_per_s: float) -> None:
    study.set_user_attr(DRAWS, [*baseline_draws(study), float(samples_per_s)])
