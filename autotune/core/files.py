"""Files and folders: atomic writes (a reader, a user, a controller, optuna-dashboard, sees the whole
file or the old one), and which OS errors are the disk's or the path's fault rather than autotune's."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

# A write the disk refused: full, over quota, read-only, no permission. Bad input (exit 2), never a crash.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
# A path that cannot be a folder: a file where a folder should be (on the way, or at the end), a name
# too long, a loop of links. Also bad input: the user named it.
PATH_ERRNOS = frozenset({errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP})


def disk_error(e: OSError) -> bool:
    """A write that failed because of the disk (full, read-only, no permission), not because of autotune."""
    return e.errno in DISK_ERRNOS


def path_error(e: OSError) -> bool:
    """An OSError that says the path itself cannot be used as given (not a folder, too long, a link loop)."""
    return e.errno in PATH_ERRNOS


def folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` can never be a folder autotune makes or uses ("... is a file", "file name too long"),
    or None when it is one or could be made. Nothing is created: a command asks before it writes."""
    p = Path(path)
    try:
        # pathlib answers False, not an error, for ENOTDIR and ELOOP; ENAMETOOLONG and EACCES raise.
        if p.is_dir():
            return None
        for at in (p, *p.absolute().parents):  # the path, then the nearest ancestor there is
            if at.is_symlink() and not at.exists():
                return f"{at} is a link that leads to no folder (a loop or a missing target)"
            if at.exists():
                return None if at.is_dir() else f"{at} is a file, not a folder"
    except OSError as e:
        return e.strerror or str(e)
    return None


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temp file in the same directory and os.replace, so a reader never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; an export is meant to be shared, so keep the old mode or use 0644.
        os.chmod(tmp, p.stat().st_mode & 0o777 if p.exists() else 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str))
