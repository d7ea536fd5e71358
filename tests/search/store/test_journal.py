"""The study store survives a torn write, refuses a corrupt middle, and a full or read-only disk is
one clear line before any trial starts. Real journals, real files, a real tmpfs where it can be mounted."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from pathlib import Path
from collections.abc import Iterator

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.core.errors import StorageError
from autotune.search.store import journal
from autotune.search.store.storage import check_writable, open_storage


def make_study(path: Path, n: int = 3) -> list[float]:
    """A study as autotune leaves it: complete trials with values and attrs."""
    study = optuna.create_study(study_name="autotune", storage=open_storage(str(path)), direction="maximize")
    values = []
    for i in range(n):
        t = study.ask()
        t.set_user_attr("role", "baseline" if i == 0 else "search")
        t.set_user_attr("config", {"batch_size": 8})
        t.set_user_attr("speedup", 1.0 + i)
        t.set_constraint("infeasible", 0.0)
        study.tell(t, 10.0 * (i + 1))
        values.append(10.0 * (i + 1))
    return values


def trials(path: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="autotune", storage=open_storage(str(path))).trials


def test_scan_finds_torn_tails_and_corrupt_middles() -> None:
    rec = b'{"op_code": 1}\n'
    assert journal.scan(rec * 3) == (3, len(rec) * 3, None)
    assert journal.scan(rec * 3 + b'{"op_co') == (3, len(rec) * 3, None)  # no newline: torn
    assert journal.scan(rec * 3 + b'{"op_co\n') == (3, len(rec) * 3, None)  # unparsable last line: torn
    assert journal.scan(rec + b"garbage\n" + rec)[2] == 2  # the middle: refused, by line


def test_torn_tail_is_cut_with_a_copy_and_show_reads_every_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "studies.db"
    make_study(db)
    original = db.read_bytes()
    db.write_bytes(original[:-40])  # a crash mid-write
    assert main(["show", "--storage", str(db)]) == 0
    out, err = capsys.readouterr()
    assert "cut a torn final record (" in err and "kept" in err and err.count("\n") == 1
    backups = list(tmp_path.glob("studies.db.torn-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == original[:-40]
    assert db.read_bytes().endswith(b"\n") and original.startswith(db.read_bytes())
    assert "20.00" in out and "10.00" in out  # the trials before the torn record are shown, not an empty board
    # Appending after the repair leaves a journal that reads back whole.
    study = optuna.load_study(study_name="autotune", storage=open_storage(str(db)))
    t = study.ask()
    study.tell(t, 99.0)
    assert [x.value for x in trials(db) if x.state == TrialState.COMPLETE][-1] == 99.0


def test_corrupt_middle_is_refused_and_nothing_is_appended(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "studies.db"
    make_study(db)
    lines = db.read_bytes().split(b"\n")
    lines.insert(3, b'{"op_code": 4, "trial_id": 0, "sta')  # a torn record with records after it
    db.write_bytes(b"\n".join(lines))
    before = db.read_bytes()
    for argv in (
        ["show", "--storage", str(db)],
        ["export", "--storage", str(db)],
        [
            "search",
            "--budget",
            "1m",
            "--storage",
            str(db),
            "--studies-dir",
            str(tmp_path / "st"),
            "--pipeline",
            "tests.fault_pipelines:tiny",
        ],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "line 4" in err and str(db) in err and len(err.strip().splitlines()) == 1
    assert db.read_bytes() == before and not list(tmp_path.glob("studies.db.torn-*"))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a real full disk. Root can mount one; elsewhere the test is skipped."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); the faked test covers the rest")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_one_line_and_no_trial(tiny_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tiny_disk / "studies.db"
    make_study(db, n=1)
    with (tiny_disk / "filler").open("wb", buffering=0) as f:  # fill what is left
        with pytest.raises(OSError) as e:
            while True:
                f.write(b"\0" * 4096)
    assert e.value.errno == errno.ENOSPC
    code = main(
        [
            "search",
            "--budget",
            "1m",
            "--storage",
            str(db),
            "--studies-dir",
            str(tiny_disk / "studies"),
            "--pipeline",
            "tests.fault_pipelines:tiny",
            "--image-size",
            "64",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "cannot write to" in err and "No space left" in err and len(err.strip().splitlines()) == 1
    assert len(trials(db)) == 1  # no trial was started; the study still reads
    assert main(["show", "--storage", str(db)]) == 0


def test_read_only_folder_keeps_the_study_readable(tiny_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tiny_disk / "studies.db"
    make_study(db, n=2)
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    assert main(["show", "--storage", str(db)]) == 0
    assert "20.00" in capsys.readouterr().out
    code = main(
        [
            "search",
            "--budget",
            "1m",
            "--storage",
            str(db),
            "--studies-dir",
            str(tiny_disk / "st"),
            "--pipeline",
            "tests.fault_pipelines:tiny",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Read-only file system" in err and len(err.strip().splitlines()) == 1


def test_check_writable_fakes_enospc_at_the_write_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no tmpfs can be mounted: the same refusal, with ENOSPC raised by the write itself."""
    real_open = Path.open

    def full(self: Path, mode: str = "r", *a: object, **k: object):  # type: ignore[no-untyped-def]
        if self.name.startswith(".autotune-probe") and "w" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_open(self, mode, *a, **k)

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(StorageError, match="No space left on device"):
        check_writable(str(tmp_path / "studies.db"), str(tmp_path / "studies"))
    assert not list((tmp_path / "studies").iterdir())  # the probe is gone


def test_torn_tail_on_read_only_media_is_refused_not_misread(tiny_disk: Path) -> None:
    db = tiny_disk / "studies.db"
    make_study(db, n=2)
    data = db.read_bytes()
    db.write_bytes(data[:-25])
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    with pytest.raises(StorageError, match="torn record"):
        open_storage(str(db))


def test_repair_does_not_cut_a_record_being_written(tmp_path: Path) -> None:
    """The check holds Optuna's journal lock: while another process holds it, the check waits."""
    db = tmp_path / "studies.db"
    make_study(db, n=1)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom optuna.storages.journal import JournalFileSymlinkLock\n"
                f"l = JournalFileSymlinkLock({str(db)!r}); l.acquire()\n"
                f"open({str(db)!r}, 'ab').write(b'{{\"op_code\": 0, \"half')\n"
                "print('held', flush=True); time.sleep(1.5)\n"
                f"open({str(db)!r}, 'ab').write(b'\": 1}}\\n'); l.release()\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert journal.check(db, say=lambda s: None) is None  # waited for the writer: nothing torn, nothing cut
    holder.wait(timeout=10)
    assert db.read_bytes().endswith(b'"half": 1}\n')
