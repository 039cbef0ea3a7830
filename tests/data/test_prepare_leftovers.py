"""What a ``distlaunch data prepare`` killed outright (``kill -9``) leaves beside ``--out`` is removed by the
next prepare to the same ``--out``, and never the folder of a prepare that runs at the same time; one
stopped by SIGTERM or a closed terminal (SIGHUP) removes its own (real processes, real signals: a prepare
holds its hidden folder with a flock that ends with the process)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from distlaunch.data.index import read_index
from distlaunch.data.source import BUNDLED_CORPUS
from tests.data.conftest import prepare
from tests.helpers import distlaunch_cmd, wait_until


def hidden(parent: Path, name: str = "ds") -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def locked_by(pid: int, folder: Path) -> bool:
    """Whether process ``pid`` holds a flock on ``folder`` (read from /proc/locks: looking never takes it)."""
    try:
        inode = folder.stat().st_ino
    except OSError:
        return False
    held = ([*line.split(), "", "", "", "", "", ""][:6] for line in Path("/proc/locks").read_text().splitlines())
    # "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234567 0 EOF" (waiters read "1: -> FLOCK ...": never matched)
    return any(f[1] == "FLOCK" and f[4] == str(pid) and f[5].rsplit(":", 1)[-1] == str(inode) for f in held)


def start_slow_prepare(tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    """A real prepare that trains a BPE on a few copies of the bundled corpus (seconds), and its hidden
    folder, once the prepare holds it locked."""
    corpus = tmp_path / "big.txt"
    corpus.write_text(BUNDLED_CORPUS.read_text() * 3)
    proc = subprocess.Popen(
        distlaunch_cmd("data", "prepare", str(corpus), "--out", str(out), "--tokenizer", "bpe:400"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def held() -> Path | None:
        return next((f for f in out.parent.glob(f".{out.name}.prepare-*") if locked_by(proc.pid, f)), None)

    try:
        assert wait_until(lambda: held() is not None or proc.poll() is not None, timeout=60)
        folder = held()
        assert folder is not None, f"prepare ended before it was seen at work: {proc.communicate()}"
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, folder


def small_prepare(tmp_path: Path, out: Path):
    text = tmp_path / "small.txt"
    text.write_text(BUNDLED_CORPUS.read_text()[:20000])
    return prepare(str(text), "--out", str(out), "--tokenizer", "bpe:300")


def test_the_folder_of_a_prepare_killed_outright_is_removed_by_the_next_prepare_to_that_out(tmp_path):
    out = tmp_path / "ds"
    proc, folder = start_slow_prepare(tmp_path, out)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert hidden(tmp_path) == [folder.name]  # what kill -9 leaves
    (tmp_path / ".other.prepare-0123abcd").mkdir()  # another --out's: not this prepare's to sweep
    r = small_prepare(tmp_path, out)
    assert r.exit_code == 0, r.stderr
    assert hidden(tmp_path) == []
    assert (tmp_path / ".other.prepare-0123abcd").is_dir()
    assert read_index(out).documents == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_prepare_stopped_by_sigterm_or_a_closed_terminal_removes_its_folder_and_says_so(tmp_path, sig):
    out = tmp_path / "ds"
    proc, folder = start_slow_prepare(tmp_path, out)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err.strip() == f"error: interrupted by {sig.name}; {out} unchanged", err
    assert not folder.exists() and hidden(tmp_path) == [] and not out.exists()


def test_a_prepare_running_at_the_same_time_keeps_its_folder_and_finishes(tmp_path):
    out = tmp_path / "ds"
    first, folder = start_slow_prepare(tmp_path, out)
    try:
        os.kill(first.pid, signal.SIGSTOP)  # it holds its folder, and does nothing while the second runs
        r = small_prepare(tmp_path, out)
        assert r.exit_code == 0, r.stderr
        assert folder.is_dir() and hidden(tmp_path) == [folder.name]
        assert read_index(out).sources == [str(tmp_path / "small.txt")]
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert read_index(out).sources == [str(tmp_path / "big.txt")]  # the first prepare published last
    assert hidden(tmp_path) == []


def test_a_replaced_dataset_left_half_deleted_goes_once_out_is_in_place_and_stays_without_it(tmp_path):
    out = tmp_path / "ds"
    old = tmp_path / ".ds.old-89abcdef"  # a publish killed between its two renames, or while it deleted
    old.mkdir()
    (old / "index.json").write_text("{}")
    r = small_prepare(tmp_path, out)  # no ds yet: that folder is the only copy of the earlier dataset
    assert r.exit_code == 0, r.stderr
    assert hidden(tmp_path) == [old.name]
    r = small_prepare(tmp_path, out)
    assert r.exit_code == 0, r.stderr
    assert hidden(tmp_path) == []
