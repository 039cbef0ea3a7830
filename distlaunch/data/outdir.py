"""Where ``distlaunch data prepare`` writes: the dataset is built in a hidden folder beside ``--out``
and renamed into place only when complete, so a failed or interrupted run leaves the old dataset
(or no folder at all), never a half-written one.

``--out`` must be new, empty, or a dataset folder holding only its own files (those its index names):
prepare replaces the whole folder, so it refuses one that holds anything else.

The hidden folder (``.NAME.prepare-XXXXXXXX``) is held by an exclusive ``flock`` on the folder itself
for as long as its prepare runs; the kernel drops the lock when that process ends, however it ends.
So a folder of that name whose lock can be taken was left by a prepare killed outright (``kill -9``,
power loss): the next prepare to the same ``--out`` removes it, and never one that another prepare,
running now, still holds.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distlaunch.data.index import INDEX_FILE, read_index
from distlaunch.errors import UsageError
from distlaunch.files import lock_folder

FRESH = "pick a new or empty folder"
# Hidden folders beside NAME: .NAME.prepare-XXXXXXXX, a dataset being built; .NAME.old-XXXXXXXX, the dataset
# NAME replaced, being deleted (XXXXXXXX: TOKEN_BYTES random bytes in hex).
WORK, OLD, TOKEN_BYTES = "prepare", "old", 4
ATTEMPTS = 5  # fresh work folders tried when an abandoned-folder sweep of another prepare takes ours


def check_out(raw: str | Path) -> Path:
    """The absolute folder ``--out`` names, refused when prepare could not safely replace it."""
    if str(raw) == "":
        raise UsageError("--out is empty", "name the folder to write the dataset to, e.g. --out data/mine")
    given = Path(raw).expanduser()
    # a link to a folder: replace the folder it points at, and keep the link
    out = given.resolve() if given.is_symlink() else Path(os.path.abspath(given))
    cwd = Path.cwd()
    if out == cwd or out in cwd.parents:
        raise UsageError(
            f"--out {raw} is the current folder or holds it",
            "name a folder for the dataset, e.g. --out data/mine (prepare replaces the whole folder)",
        )
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                what = "is a file" if folder == out else f"cannot be made: {folder} is a file, not a folder"
                raise UsageError(f"--out {raw} {what}", "pass a folder (it is created if missing)")
            break
    if not out.is_dir():
        return out
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return out
    if INDEX_FILE not in names:
        raise UsageError(
            f"--out {raw} is not empty and holds no prepared dataset ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''})",
            f"{FRESH}: prepare replaces only a dataset folder it wrote",
        )
    try:
        index = read_index(out)
    except UsageError as err:
        raise UsageError(
            f"--out {raw} holds a damaged dataset: {err.message}", f"remove it first, or {FRESH}"
        ) from None
    own = {INDEX_FILE, index.tokenizer.file, *(s.file for s in index.shards), *(s.docs_file for s in index.shards)}
    foreign = [name for name in names if name not in own]
    if foreign:
        raise UsageError(
            f"--out {raw} holds files that are not part of its dataset: {', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}",
            f"move them out first (prepare replaces the whole folder), or {FRESH}",
        )
    return out


@contextmanager
def staged(out: Path, shown: str) -> Iterator[Path]:
    """A fresh hidden folder beside ``out`` to build the dataset in, locked while this runs; on any
    failure it is removed, with the parents of ``out`` this made, and an OSError becomes a UsageError.
    Folders of earlier prepares to ``out`` that were killed outright are removed first."""
    made: list[Path] = []
    try:
        missing = [p for p in out.parents if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            made.append(folder)
        tmp, lock = _make_work_folder(out)
    except OSError as err:
        _remove(None, made)
        where = out.parent if str(err.filename).startswith(str(out.parent / f".{out.name}.")) else err.filename
        raise UsageError(
            f"cannot write --out {shown}: cannot make a folder in {where} ({err.strerror})",
            f"pick a folder you can write to (prepare builds the dataset in {out.parent}, then renames it)",
        ) from None
    try:
        remove_abandoned(out)
        yield tmp
    except OSError as err:
        _remove(tmp, made)
        where = f" ({err.filename})" if err.filename else ""
        raise UsageError(f"{err.strerror or err}{where}; {shown} unchanged", "free space or fix the file") from None
    except BaseException:
        _remove(tmp, made)
        raise
    finally:
        os.close(lock)


def hidden(out: Path, kind: str) -> Path:
    """A new name for a hidden folder of ``kind`` (WORK or OLD) beside ``out``."""
    return out.parent / f".{out.name}.{kind}-{secrets.token_hex(TOKEN_BYTES)}"


def hidden_names(out: Path, kind: str) -> re.Pattern[str]:
    """What ``hidden(out, kind)`` names look like."""
    return re.compile(re.escape(f".{out.name}.{kind}-") + f"[0-9a-f]{{{2 * TOKEN_BYTES}}}")


def _make_work_folder(out: Path) -> tuple[Path, int]:
    """A new ``.NAME.prepare-XXXXXXXX`` beside ``out`` and the descriptor that holds its lock. Between
    its mkdir and its lock, another prepare's sweep may take it for abandoned and remove it: then
    another name is tried."""
    for _ in range(ATTEMPTS):
        tmp = hidden(out, WORK)
        tmp.mkdir()
        lock = lock_folder(tmp)
        if lock is not None:
            return tmp, lock
    raise OSError(0, "another prepare keeps removing the folders made here", str(tmp))


def remove_abandoned(out: Path) -> list[Path]:
    """Remove what prepares to ``out`` killed outright left beside it: ``.NAME.prepare-*`` folders no live
    prepare holds locked, and ``.NAME.old-*`` folders once ``out`` is in place (a publish killed while it
    deleted the replaced dataset; without ``out``, such a folder is the only copy of the dataset and stays)."""
    work, old = hidden_names(out, WORK), hidden_names(out, OLD)
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return []
    removed = []
    for name in names:
        path = out.parent / name
        if work.fullmatch(name):
            lock = lock_folder(path)
            if lock is None:  # a prepare running now (or not a folder of ours)
                continue
            try:
                shutil.rmtree(path, ignore_errors=True)
            finally:
                os.close(lock)
        elif old.fullmatch(name) and os.path.isdir(out) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _remove(tmp: Path | None, made: list[Path]) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            break


def publish(tmp: Path, out: Path) -> None:
    """Put the complete dataset ``tmp`` in the place of ``out`` (two renames; a Ctrl-C waits for them)."""
    with _sigint_deferred():
        if out.exists():
            old = hidden(out, OLD)
            os.rename(out, old)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(old, out)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A SIGINT inside is noted, and handed to the handler before it once the block is over: never lost, and never
    between two renames. The handler is read before anything changes, so an interrupt at any moment here leaves
    it as it was (where ``distlaunch`` runs this, its own rule holds the signals already)."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None:  # not the main thread, or a handler set outside Python: nothing to defer with
        yield
        return
    came: list[int] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came and callable(previous):
        previous(signal.SIGINT, None)
    elif came and previous == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)
