"""What ended a process's work, in the one vocabulary of statuses (core/errors.py): the trial worker,
`train`'s runs and the probe each turn an exception into (status, one line) here, and their launcher
reads the ranks' verdicts back through `named_failure`, so one cause gets one status and one exit code
whichever command met it."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

from autotune.core.errors import AutotuneError, DataItemError, TrialUnsupported, exit_code_for
from autotune.core.files import write_json_atomic
from autotune.core.outcomes import Reason

# Statuses whose traceback helps whoever reads the log: the others are said fully by their one line.
TRACEBACK_WORTHY = frozenset({Reason.DATA, Reason.OOM, Reason.ERROR})


def status_of(e: BaseException) -> tuple[str, str]:
    """(status, one line) for the exception that ended a trial, a training run or a probe."""
    from autotune.trial.loop.harness import is_out_of_memory, oom_message  # lazy: torch, not for the launcher or CLI
    from autotune.trial.measurement.clock import NonFiniteLoss  # lazy: torch, as above

    if isinstance(e, AutotuneError):
        return Reason.BAD_CONFIG, str(e)
    if isinstance(e, DataItemError):  # an undecodable item: named, one line, like any bad input
        return Reason.DATA, e.summary
    if isinstance(e, TrialUnsupported):
        return Reason.UNSUPPORTED, str(e)
    if isinstance(e, NonFiniteLoss):
        return Reason.NUMERICS, str(e)
    if is_out_of_memory(e):
        return Reason.OOM, oom_message(e)
    return Reason.ERROR, f"{type(e).__name__}: {e}"


def read_verdicts(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The verdicts the ranks left (one JSON object each); an unreadable one is skipped."""
    out = []
    for path in sorted(paths):
        try:
            v = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(v, dict):
            out.append(v)
    return out


def named_failure(verdicts: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The failed ranks' verdict that names the cause. Under DDP a peer of the rank that failed fails too,
    in a collective ("error", connection closed), so a named status (oom, numerics, ...) wins over "error"."""
    failed = [v for v in verdicts if v.get("status") != "ok"]
    return min(failed, key=lambda v: v.get("status") == Reason.ERROR, default=None)


def entry_main(name: str, measure: Callable[[], dict[str, Any]], out: Path) -> int:
    """The end of a measuring entry point (`python -m autotune.trial.probes.model_facts`, `.ceiling`): its result to `out`,
    exit 0; or one classified line on stderr (a traceback above it where one helps) and that status's
    exit code, which the launcher's run_entry reports."""
    try:
        result = measure()
    except Exception as e:
        status, message = status_of(e)
        if status in TRACEBACK_WORTHY:
            traceback.print_exc()  # kept in the entry's log, above the one line reported
        print(f"autotune {name}: {status}: {message}", file=sys.stderr, flush=True)
        return int(exit_code_for(status))
    write_json_atomic(out, result)
    return 0
