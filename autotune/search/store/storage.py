"""Open an Optuna storage from what the user typed, refusing anything that isn't a study store."""

from __future__ import annotations

import json
import errno
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from autotune.core.errors import StorageError
from autotune.core.urls import mask_url
from autotune.search.store import journal

DEFAULT_STORAGE = "studies.db"
SQLITE_MAGIC = b"SQLite format 3\x00"
RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql")


def is_rdb(url: str) -> bool:
    return url.split("://", 1)[0].split("+", 1)[0] in RDB_SCHEMES and "://" in url


def check_journal_file(path: Path) -> None:
    """A bare path is an Optuna JournalFile: what `optuna-dashboard studies.db` opens as typed."""
    if path.is_dir():
        raise StorageError(f"storage {path} is a directory, not a journal file")
    if not path.exists() or path.stat().st_size == 0:
        if not path.parent.exists():
            raise StorageError(f"storage {path}: folder {path.parent} does not exist")
        return
    with path.open("rb") as f:
        head = f.read(4096)
    if head.startswith(SQLITE_MAGIC):
        raise StorageError(
            f"storage {path} is an SQLite database; pass --storage sqlite:///{path} "
            "(and give optuna-dashboard the same URL)"
        )
    first = head.split(b"\n", 1)[0]
    try:
        ok = isinstance(json.loads(first), dict) and b"op_code" in first
    except ValueError:
        ok = False
    if not ok:
        raise StorageError(f"storage {path} is not an Optuna journal file (first line is not a journal record)")


def open_storage(url: str | None) -> Any:
    """Bare path -> JournalStorage; sqlite/postgresql/mysql URL -> RDBStorage; grpc://host:port -> proxy."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    url = url or DEFAULT_STORAGE
    shown = mask_url(url)
    if "://" not in url:
        path = Path(url)
        check_journal_file(path)
        journal.check(path, say=lambda line: print(line, file=sys.stderr))  # never append after a torn record
        return JournalStorage(JournalFileBackend(str(path), lock_obj=journal.journal_lock(path)))
    scheme = url.split("://", 1)[0]
    _check_driver(scheme, shown)
    try:
        if scheme == "grpc":
            host, _, port = url.split("://", 1)[1].rstrip("/").rpartition(":")
            if not host or not port.isdigit():
                raise StorageError(f"storage {shown}: expected grpc://host:port")
            return optuna.storages.GrpcStorageProxy(host=host, port=int(port))
        if is_rdb(url):
            # Heartbeats let any worker fail (and retry) a trial whose owner died: RDB storages only.
            beat = float(os.environ.get("AUTOTUNE_HEARTBEAT_S", 30))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url,
                    heartbeat_interval=max(1, int(beat)),
                    grace_period=max(2, int(3 * beat)),
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
                    engine_kwargs={"pool_pre_ping": True},
                )
    except StorageError:
        raise
    except Exception as e:  # sqlalchemy/driver errors: unreachable host, bad URL, missing driver
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise StorageError(f"cannot open storage {shown}: {first.replace(url, shown)}") from None
    raise StorageError(
        f"storage {shown}: unknown scheme {scheme!r} (use a path, sqlite:///, postgresql://, mysql:// or grpc://)"
    )


# scheme -> (the modules, any one of which serves it; the extra that installs one). A missing driver is
# bad input named by the extra, not sqlalchemy's NoSuchModuleError several frames deep.
DRIVERS = {
    "grpc": (("grpc",), "postgres"),
    "postgresql": (("psycopg", "psycopg2"), "postgres"),
    "postgresql+psycopg": (("psycopg",), "postgres"),
    "postgresql+psycopg2": (("psycopg2",), "postgres"),
}


def _check_driver(scheme: str, shown: str) -> None:
    import importlib.util

    if scheme not in DRIVERS:
        return
    modules, extra = DRIVERS[scheme]
    if not any(importlib.util.find_spec(m) for m in modules):
        raise StorageError(
            f"storage {shown} needs {' or '.join(modules)}, which is not installed: pip install 'autotune[{extra}]'"
        )


PROBE_BYTES = 1 << 20  # room for a trial's logs and a few journal records


def check_writable(url: str | None, studies_dir: str) -> None:
    """Before a search or worker starts a trial: the studies folder and a journal's folder must take a
    real write (a full disk, a read-only mount and a missing permission all show here), or it is bad
    input. Reading commands skip this, so a study on read-only media stays readable."""
    places = [Path(studies_dir)]
    url = url or DEFAULT_STORAGE
    if "://" not in url:
        places.append(Path(url).resolve().parent)  # the journal and Optuna's lock file live there
    for folder in places:
        probe = folder / f".autotune-probe-{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with probe.open("wb") as f:
                f.write(b"\0" * PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise StorageError(
                f"cannot write to {folder}: {e.strerror or e} "
                f"({errno.errorcode.get(e.errno or 0, 'error')}); free space or fix permissions, "
                "or point --studies-dir / --storage elsewhere"
            ) from None
        finally:
            probe.unlink(missing_ok=True)
    if "://" not in url and Path(url).exists() and not os.access(url, os.W_OK):
        raise StorageError(f"cannot write to {url}: permission denied; the study stays readable by show and export")


def shown_storage(url: str | None) -> str:
    """The storage as it may be printed: the default journal's path, or the URL with its password masked."""
    return mask_url(url or DEFAULT_STORAGE)
