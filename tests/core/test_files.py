"""core/files.py: which OS errors are the disk's or the path's fault, and whether a path can be a folder,
answered without creating anything."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from autotune.core.files import DISK_ERRNOS, PATH_ERRNOS, disk_error, folder_problem, path_error


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_full_read_only_or_forbidden_disk_is_a_disk_error(code: int) -> None:
    assert disk_error(OSError(code, os.strerror(code))) and not path_error(OSError(code, os.strerror(code)))


@pytest.mark.parametrize("code", [errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP])
def test_a_path_that_cannot_be_a_folder_is_a_path_error(code: int) -> None:
    assert path_error(OSError(code, os.strerror(code))) and not disk_error(OSError(code, os.strerror(code)))


def test_anything_else_is_neither() -> None:
    assert not DISK_ERRNOS & PATH_ERRNOS
    for code in (errno.EBADF, errno.EIO, errno.ENOENT, errno.EISDIR):
        assert not disk_error(OSError(code, "x")) and not path_error(OSError(code, "x"))
    assert not disk_error(OSError("no errno")) and not path_error(OSError("no errno"))


def test_a_folder_or_one_that_can_be_made_has_no_problem(tmp_path: Path) -> None:
    assert folder_problem(tmp_path) is None
    assert folder_problem(tmp_path / "a" / "b" / "c") is None
    assert folder_problem("relative/studies") is None
    (tmp_path / "link").symlink_to(tmp_path)
    assert folder_problem(tmp_path / "link" / "new") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]  # nothing was made


def test_paths_that_can_never_be_folders(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing" / "target")
    assert folder_problem(tmp_path / "notes.txt") == f"{tmp_path / 'notes.txt'} is a file, not a folder"
    assert folder_problem(tmp_path / "notes.txt" / "a" / "b") == f"{tmp_path / 'notes.txt'} is a file, not a folder"
    assert "leads to no folder" in (folder_problem(tmp_path / "loop" / "studies") or "")
    assert "leads to no folder" in (folder_problem(tmp_path / "dangling") or "")
    assert "too long" in (folder_problem(tmp_path / ("n" * 300)) or "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "loop", "notes.txt"]
    for problem in [folder_problem(p) for p in (tmp_path / "notes.txt" / "x", tmp_path / ("n" * 300))]:
        assert problem and "\n" not in problem  # one line, for the CLI's one line
