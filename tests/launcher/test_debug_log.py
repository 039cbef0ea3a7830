"""The internal-error debug log: a new 0600 file in a private 0700 folder; planted links are never followed."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from distlaunch.cli import app
from tests.fixtures.tmpfs import small_disk


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where gettempdir() points, as TMPDIR would
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_internal_error_writes_the_traceback_to_a_private_file(tmpdir_here, capsys):
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        assert app._internal_error(exc) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: internal error: RuntimeError: boom (hint: this is a distlaunch bug;")
    path = err.rsplit("the traceback is in ", 1)[1].rstrip(")\n")
    folder = tmpdir_here / f"distlaunch-{os.getuid()}"
    assert os.path.dirname(path) == str(folder) and _mode(folder) == 0o700 and _mode(path) == 0o600
    assert 'raise RuntimeError("boom")' in Path(path).read_text(encoding="utf-8")


def test_a_planted_symlink_or_an_open_folder_is_not_used(tmpdir_here):
    victim = tmpdir_here / "victim"
    victim.mkdir()
    planted = tmpdir_here / f"distlaunch-{os.getuid()}"
    planted.symlink_to(victim)
    path = app.write_debug_log("secret traceback")
    assert not os.listdir(victim) and not path.startswith(str(planted) + os.sep)
    assert _mode(os.path.dirname(path)) == 0o700 and _mode(path) == 0o600
    planted.unlink()
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)  # writable by anyone: others could plant files there
    path = app.write_debug_log("secret traceback")
    assert not os.listdir(planted) and _mode(os.path.dirname(path)) == 0o700


def test_each_error_gets_its_own_file(tmpdir_here):
    first, second = app.write_debug_log("one"), app.write_debug_log("two")
    assert first != second and Path(first).read_text() == "one" and Path(second).read_text() == "two"


def test_a_full_temporary_folder_still_gets_one_line_that_says_where_it_was_raised(tmp_path, monkeypatch, capsys):
    with small_disk(tmp_path / "disk", "64k") as disk:
        with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            assert app._internal_error(exc) == 1
        assert not os.listdir(disk / f"distlaunch-{os.getuid()}")  # no empty log left behind
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        "error: internal error: RuntimeError: boom (hint: this is a distlaunch bug; it was raised at "
    )
    assert (
        "test_debug_log.py:" in err and f"its traceback could not be written in {disk}: No space left on device" in err
    )
