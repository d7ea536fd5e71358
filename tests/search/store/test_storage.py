"""autotune/search/store/storage.py: what the user typed becomes a real Optuna storage, or one clear StorageError."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage

from autotune.core.errors import AutotuneError, StorageError
from autotune.search.store.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)


def add_trials(storage: object, name: str = "s", values: tuple[float, ...] = (1.5, 4.0)) -> None:
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    for v in values:
        t = study.ask()
        t.set_user_attr("role", "search")
        study.tell(t, v)


# --- a bare path is a JournalFile ---------------------------------------------------------------------


def test_bare_path_is_a_journal_that_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "studies.db"
    storage = open_storage(str(path))
    assert isinstance(storage, JournalStorage)
    add_trials(storage)
    assert path.is_file() and path.stat().st_size > 0
    again = open_storage(str(path))  # a written journal passes the file check
    study = optuna.load_study(study_name="s", storage=again)
    assert [t.value for t in study.trials] == [1.5, 4.0]
    assert study.trials[0].user_attrs == {"role": "search"}
    assert study.best_value == 4.0


def test_empty_file_is_a_new_journal(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    path.touch()
    add_trials(open_storage(str(path)), values=(2.0,))
    assert optuna.load_study(study_name="s", storage=open_storage(str(path))).best_value == 2.0


def test_default_is_studies_db_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    add_trials(open_storage(None))
    assert (tmp_path / "studies.db").stat().st_size > 0
    assert optuna.get_all_study_names(open_storage(str(tmp_path / "studies.db"))) == ["s"]


def test_sqlite_url_is_an_rdb_storage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    storage = open_storage(url)
    assert isinstance(storage, RDBStorage)
    add_trials(storage, values=(3.0,))
    assert optuna.load_study(study_name="s", storage=open_storage(url)).best_value == 3.0


# --- refused paths ------------------------------------------------------------------------------------


def test_sqlite_file_given_as_a_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    con = sqlite3.connect(path)
    con.execute("create table t (a)")
    con.commit()
    con.close()
    before = path.read_bytes()
    with pytest.raises(StorageError, match=f"sqlite:///{path}"):
        open_storage(str(path))
    assert path.read_bytes() == before  # not touched


def test_a_real_optuna_sqlite_db_given_as_a_path_is_refused(tmp_path: Path) -> None:
    """The classic mix-up: a study made with --storage sqlite:///x.db, later opened as `x.db`."""
    path = tmp_path / "x.db"
    add_trials(open_storage(f"sqlite:///{path}"))
    with pytest.raises(StorageError, match="sqlite:///"):
        open_storage(str(path))


def test_text_file_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("remember the milk\n")
    with pytest.raises(StorageError, match="not an Optuna journal"):
        open_storage(str(path))
    assert path.read_text() == "remember the milk\n"


@pytest.mark.parametrize("first_line", ['{"a": 1}', "[1, 2]", '"op_code"', "\x00\x01binary"])
def test_json_that_is_not_a_journal_record_is_refused(tmp_path: Path, first_line: str) -> None:
    path = tmp_path / "other.json"
    path.write_text(first_line + "\n")
    with pytest.raises(StorageError, match="not an Optuna journal"):
        open_storage(str(path))


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="directory"):
        open_storage(str(tmp_path))


def test_missing_parent_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="does not exist") as e:
        open_storage(str(tmp_path / "no" / "such" / "studies.db"))
    assert str(tmp_path / "no" / "such") in str(e.value)
    assert not (tmp_path / "no").exists()  # nothing created on the way


def test_storage_errors_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError):  # the CLI turns these into exit 2
        open_storage(str(tmp_path))


# --- refused URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, scheme", [("ftp://x/y", "ftp"), ("redis://localhost:6379/0", "redis"), ("http://localhost:8080", "http")]
)
def test_unknown_scheme_is_refused(url: str, scheme: str) -> None:
    with pytest.raises(StorageError, match=f"unknown scheme '{scheme}'"):
        open_storage(url)


def test_unknown_scheme_message_masks_the_password() -> None:
    with pytest.raises(StorageError) as e:
        open_storage("ftp://bob:hunter2@files.example/x")
    assert "hunter2" not in str(e.value) and "***" in str(e.value)


@pytest.mark.parametrize("url", ["grpc://localhost", "grpc://:50051", "grpc://host:port", "grpc://host:", "grpc://"])
def test_bad_grpc_url_is_refused(url: str) -> None:
    with pytest.raises(StorageError, match="grpc://host:port"):
        open_storage(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:s3cret@127.0.0.1:1/db",
        "postgresql+psycopg://bob:s3cret@127.0.0.1:1/db",
        "postgresql://bob@127.0.0.1:1/db?password=s3cret",
        "postgresql://bob:s3cr%40t@127.0.0.1:1/db",  # an escaped '@' in the password
        "postgresql://bob:s3cret@127.0.0.1:1/db?sslmode=bogus",  # a driver error about the URL itself
        "mysql://bob:s3cret@127.0.0.1:1/db",
        "sqlite://127.0.0.1/x.db?password=s3cret",  # SQLAlchemy repeats this URL in its error, query and all
        "sqlite://bob:s3cret@127.0.0.1/x.db",
    ],
)
def test_unreachable_database_never_shows_the_password(url: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(StorageError) as e:
        open_storage(url)
    assert time.monotonic() - t0 < 10  # port 1 refuses at once: no long retry loop
    msg = str(e.value)
    assert "s3cr" not in msg, msg
    assert "***" in msg and "127.0.0.1" in msg  # still says which storage failed
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no driver traceback carrying the URL


def test_unopenable_sqlite_url_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot open storage"):
        open_storage(f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}")


@pytest.mark.parametrize(
    "url, modules",
    [
        ("postgresql://u:secret@127.0.0.1:1/db", ("psycopg", "psycopg2")),
        ("postgresql+psycopg://u:secret@127.0.0.1:1/db", ("psycopg",)),
        ("grpc://127.0.0.1:1", ("grpc",)),
    ],
)
def test_a_missing_driver_names_the_extra(url: str, modules: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    for m in modules:  # what an environment without the postgres extra finds: nothing to import
        monkeypatch.setitem(sys.modules, m, None)
    with pytest.raises(StorageError) as e:
        open_storage(url)
    msg = str(e.value)
    assert "pip install 'autotune[postgres]'" in msg and "not installed" in msg, msg
    assert "secret" not in msg and len(msg.splitlines()) == 1
