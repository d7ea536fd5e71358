"""Integrity of a journal file (the default `studies.db`), checked before anything opens it.

Optuna appends one JSON record per line and reads a file whose last line has no newline as "not
yet written". A crash or power loss mid-append leaves exactly that: a torn final record. Optuna
then appends the next record after it, which corrupts the middle of the journal for good. So:

- a torn final record (no trailing newline, or an unparsable last line) is cut off, after a copy of
  the original is kept beside it (`studies.db.torn-<timestamp>`), and one line says what was kept;
- an unparsable record in the middle is refused (exit 2), naming the file and the line, and nothing
  is appended;
- the check holds Optuna's own journal lock, so a record another process is writing right now is
  never mistaken for a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from autotune.core.errors import StorageError
from autotune.core.files import disk_error


@dataclass(frozen=True)
class Repair:
    """What a repair kept and dropped; `backup` holds the file as it was."""

    records: int
    dropped_bytes: int
    backup: Path

    def describe(self, path: Path) -> str:
        return (
            f"{path}: cut a torn final record ({self.dropped_bytes} bytes, from a crash mid-write); "
            f"kept {self.records} complete records; the original is {self.backup}"
        )


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def scan(data: bytes) -> tuple[int, int, int | None]:
    """(complete records, byte length of the good prefix, 1-based line of a corrupt middle record or None)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline; otherwise a record with no newline
    good_end, records = 0, 0
    for number, line in enumerate(lines, start=1):
        if not _is_record(line):
            is_last = number == len(lines) and not tail
            if is_last:
                return records, good_end, None  # an unparsable *last* line is a torn tail too
            return records, good_end, number
        records += 1
        good_end += len(line) + 1
    return records, good_end, None


def check(path: Path, say: Callable[[str], None] = print) -> Repair | None:
    """Verify the journal at `path`; repair a torn tail (saying so) or raise StorageError."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    lock = journal_lock(path)
    try:
        lock.acquire()
    except OSError as e:  # a read-only folder: nothing can append either, so check without the lock
        if not disk_error(e):
            raise
        return _check_locked(path, say, repair=False)
    try:
        return _check_locked(path, say, repair=True)
    finally:
        lock.release()


# An append holds the lock for milliseconds; one older than this was left by a killed writer. Optuna's
# default (30 s) made every command after a SIGKILL at the wrong moment stall that long.
LOCK_GRACE_S = 5


def journal_lock(path: Path) -> Any:
    """The lock Optuna's JournalFileBackend takes around each append, with a short stale-lock grace."""
    from optuna.storages.journal import JournalFileSymlinkLock

    return JournalFileSymlinkLock(str(path), grace_period=LOCK_GRACE_S)


def _check_locked(path: Path, say: Callable[[str], None], repair: bool) -> Repair | None:
    data = path.read_bytes()
    records, good_end, corrupt = scan(data)
    if corrupt is not None:
        raise StorageError(
            f"{path}: line {corrupt} is not a journal record, so the journal is corrupt in the "
            "middle; autotune will not write to it. Restore it from a copy, or use a new --storage"
        )
    if good_end == len(data):
        return None
    if not repair:
        raise StorageError(
            f"{path} ends with a torn record ({len(data) - good_end} bytes) and its folder is "
            "not writable, so it cannot be repaired; copy it somewhere writable"
        )
    backup = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.copy2(path, backup)
    with path.open("r+b") as f:
        f.truncate(good_end)
        f.flush()
        os.fsync(f.fileno())
    fixed = Repair(records, len(data) - good_end, backup)
    say(f"autotune: {fixed.describe(path)}")
    return fixed
