"""A script study's last word, as the study keeps it: its alone rounds (the script as written against the
export applied, each run alone in paired rounds: search/loop/alone.py), and what that record does to the
export.

It decides the export: a patched script the rounds show faster is exported with their figure as its
speedup (the trial loop's and confirmation's figures stay beside it, as the search's); one they cannot
tell from the script as written (core/paired.py: not `measurable`), or that failed alone, is not, and
the export is the baseline, "no change". A record that says it was skipped (the budget could not pay,
the script could not run alone) leaves the search's export as it is, and says why in best.yaml.

May import: autotune.core, search/store/records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.core.configfile import Export
from autotune.search.store import records

# What best.yaml keeps of the record: the figures and what they rest on, not the per-run details.
SHOWN = (
    "verdict",
    "exported",
    "median",
    "interval",
    "coverage",
    "rounds",
    "ratios",
    "unit",
    "as_written",
    "patched",
    "warmup",
    "steps",
    "timed_s",
    "search_speedup",
    "confirmed_speedup",
    "trial",
    "script",
    "args",
    "patched_args",
    "patched_copy",
    "not_in_the_diff",
    "load",
    "skipped",
)


write, read = records.write_alone, records.alone  # the record's one spelling is the records module's


def overrules(record: Mapping[str, Any] | None, number: int) -> bool:
    """Whether the alone rounds of trial `number` turn its export into "no change": they ran (not
    skipped) and could not tell it from the script as written, or its patched script failed alone."""
    if not record:
        return False
    return record.get("trial") == number and not record.get("skipped") and not record.get("measurable")


def exported(study: optuna.Study, best: FrozenTrial | None, baseline: FrozenTrial | None) -> FrozenTrial | None:
    """The trial to export: `best`, or the baseline where its alone rounds overrule it."""
    if best is not None and baseline is not None and overrules(read(study), best.number):
        return baseline
    return best


def over(study: optuna.Study, export: Export) -> Export:
    """`export` with its alone section, and the alone figure as its speedup where the rounds show a gain.
    The section is shown for the trial the rounds measured, or for the baseline exported in its place."""
    record = read(study)
    if not record:
        return export
    number = export.study.get("trial")
    as_written = export.config.is_baseline
    if record.get("trial") != number and not (as_written and overrules(record, record.get("trial", -1))):
        return export  # the rounds measured another config than this export (an older run's)
    section = {k: record[k] for k in SHOWN if k in record}
    if record.get("trial") == number and record.get("measurable"):
        return dataclasses.replace(export, alone=section, speedup=record["median"])
    return dataclasses.replace(export, alone=section)
