"""What the end of a search stores in the study's user attrs: the confirmation's summary, the gate's and each
training-math class's checks, parity's reference, the export's ceiling, a script study's alone rounds.
"""

from __future__ import annotations

import hashlib
from typing import Any, TypedDict
from collections.abc import Mapping

import optuna
from optuna.study import StudySummary


CONFIRMATION = "confirmation"  # the last confirmation's summary (search/loop/confirm.py)
# Trial number (str) -> the gate's check of it (search/loop/gate.py). A study attr, because a finished
# trial's own attrs can no longer be written.
PARITY = "parity"
# One attr per training-math class checked: "class:<hash of its label>" -> its check, label included
# (parity for a class that keeps the optimizer step, time to target for one that changes it;
# search/checks/classes.py). One key each, so fleet workers finishing checks at once never drop one another's.
CLASS_PREFIX = "class:"
CLASSES = "class_verdicts"  # how studies before per-class keys stored them: one dict, read still
REFERENCE = "parity_reference"  # parity.Reference.to_dict(), measured once per study


class CheckRecord(TypedDict, total=False):
    """A check of a config's training as stored: a class's (class_checks) or the gate's on a candidate
    (gate_checks); made by parity.ParityResult.to_dict() or target.TargetResult.to_dict(), or written
    without a run (`not checked`, with the reason). Its `verdict` is the word (core/outcomes.Verdict)."""

    kind: str  # parity | time to target
    verdict: str  # pass | fail | not checked | skipped
    reason: str
    trial: int  # the trial whose check it was
    seconds: float  # the check's wall time
    rule: str  # the rule it applied, in words
    failure: str  # the candidate's TrialFailure reason, when it failed to train
    # parity (search/checks/parity.py)
    steps: int
    samples: int
    deviation: float | None
    tolerance: float | None
    noise: float | None
    candidate_steps: int
    baseline_steps: int
    runs: int
    # time to target (search/checks/target.py)
    target_loss: float
    baseline_samples_to_target: int | None
    samples_to_target: int | None
    cap_samples: int
    speedup_to_target: float | None


class ConfirmationSummary(TypedDict, total=False):
    """confirm.summarize() and the measured seconds per trial."""

    rounds: int
    baseline_median: float | None
    rows: list[dict[str, Any]]  # label, trial, search_samples_per_s, samples, median, min, max, ratios, speedups
    winner: int | None
    order_changed: bool
    search_order: list[str]
    confirmed_order: list[str]
    trial_s: float | None


def confirmation(study: optuna.Study) -> ConfirmationSummary | None:
    """The last confirmation's summary; None when none ran."""
    return study.user_attrs.get(CONFIRMATION)


def write_confirmation(study: optuna.Study, summary: ConfirmationSummary | Mapping[str, Any]) -> None:
    study.set_user_attr(CONFIRMATION, dict(summary))


def gate_checks(study: optuna.Study) -> dict[str, CheckRecord]:
    """The parity gate's checks by trial number (as a str key); {} when the gate checked none."""
    return dict(study.user_attrs.get(PARITY) or {})


def gate_check(study: optuna.Study, number: int) -> CheckRecord | None:
    """The gate's check of trial `number`, when it made one."""
    return gate_checks(study).get(str(number))


def write_gate_checks(study: optuna.Study, checks: Mapping[str, CheckRecord]) -> None:
    study.set_user_attr(PARITY, dict(checks))


def class_checks(study: optuna.Study) -> dict[str, CheckRecord]:
    """The check of each training-math class checked, by its label; {} when none was."""
    attrs = study.user_attrs
    out: dict[str, CheckRecord] = dict(attrs.get(CLASSES) or {})
    for k, v in attrs.items():
        if k.startswith(CLASS_PREFIX) and isinstance(v, dict) and "label" in v:
            out[str(v["label"])] = {key: val for key, val in v.items() if key != "label"}  # type: ignore[assignment]
    return out


def class_key(label: str) -> str:
    """A class's attr key: a hash, since a label can outgrow a storage's indexed key column."""
    return CLASS_PREFIX + hashlib.sha256(label.encode()).hexdigest()[:20]


def write_class_check(study: optuna.Study, label: str, check: CheckRecord) -> None:
    """One write of the class's own key: no read-modify-write of a shared dict."""
    study.set_user_attr(class_key(label), {**check, "label": label})


def parity_reference(study: optuna.Study) -> dict[str, Any] | None:
    """The baseline's stored reference trajectory (parity.Reference.to_dict()); None before it is measured."""
    return study.user_attrs.get(REFERENCE) or None


def write_parity_reference(study: optuna.Study, reference: Mapping[str, Any]) -> None:
    study.set_user_attr(REFERENCE, dict(reference))


CEILING = "ceiling"  # {"trial": number, **section}: search/loop/export_ceiling.py's measurement of the export


def ceiling(study: optuna.Study | StudySummary, number: int) -> dict[str, Any] | None:
    """The ceiling measured for trial `number`, without its trial key; None when it was not measured."""
    value = study.user_attrs.get(CEILING)
    if not isinstance(value, Mapping) or value.get("trial") != number:
        return None
    return {k: v for k, v in value.items() if k != "trial"}


def write_ceiling(study: optuna.Study, number: int, section: Mapping[str, Any]) -> None:
    study.set_user_attr(CEILING, {"trial": number, **section})


ALONE = "alone"  # a script study's alone rounds (search/loop/alone.py; what they decide: search/store/last_word.py)


def alone(study: optuna.Study) -> dict[str, Any] | None:
    """The last alone rounds' record; None when none was made."""
    value = study.user_attrs.get(ALONE)
    return dict(value) if isinstance(value, Mapping) else None


def write_alone(study: optuna.Study, record: Mapping[str, Any]) -> None:
    study.set_user_attr(ALONE, dict(record))
