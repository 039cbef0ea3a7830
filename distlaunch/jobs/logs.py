"""Rank logs as the job store sees them: their names, where a job's are, and how long the store keeps them.

Every job keeps one log per rank (launcher/supervising/ranklogs.py writes them): ``rank<N>.log`` and, once it was rotated,
its previous part ``rank<N>.log.1``, in the job's folder here or in ``<log-dir>/<job id>``. The store keeps
the logs of its newest jobs only (``prune_logs``): a job's logs may take gigabytes, and a state directory must
not grow with every job ever run.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from distlaunch.jobs.store import ERRORS_FILE, OUTPUT_FILE, JobRecord, jobs_dir, read_record

RANK_LOG = "rank{rank}.log"  # a rank's output, here or in --log-dir/<job id>
OLDER_PART = ".1"  # a rank log's previous part, once it was rotated: rank0.log.1
KEEP_LOGS_OF = 20  # the jobs whose logs are kept here: as many as 'distlaunch jobs' lists


def rank_log_parts(folder: Path, rank: int) -> list[Path]:
    """A rank's log files in ``folder``, oldest first: its previous part, then the one written now."""
    path = folder / RANK_LOG.format(rank=rank)
    return [path.with_name(path.name + OLDER_PART), path]


def logged_ranks(folder: Path) -> set[int]:
    """The ranks that have a log file in ``folder`` (none when it is missing)."""
    try:
        names = [path.name for path in folder.iterdir()]
    except OSError:
        return set()
    return {rank for name in names if (rank := _rank_of(name)) is not None}


def _rank_of(name: str) -> int | None:
    """The rank whose log (or its previous part) is called ``name``: rank3.log, rank3.log.1."""
    stem = name.removesuffix(OLDER_PART)
    digits = stem.removeprefix("rank").removesuffix(".log")
    return int(digits) if digits.isdigit() and stem == RANK_LOG.format(rank=digits) else None


def _is_log(name: str) -> bool:
    return name in (OUTPUT_FILE, ERRORS_FILE) or _rank_of(name) is not None


def prune_logs(keep: int = KEEP_LOGS_OF) -> None:
    """Remove the logs kept here of the jobs that ended and are no longer among the ``keep`` newest jobs with logs
    here: their records and stacks stay. Logs in a --log-dir are the user's and never touched; a file that cannot
    be removed stays (pruning never fails a job). Only folders that still hold logs are read: once pruned, an old
    job costs a directory listing, not a record to parse, at every start."""
    root = jobs_dir()
    kept: list[tuple[JobRecord, list[Path]]] = []
    for folder in root.iterdir():
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        with contextlib.suppress(OSError):
            logs = [path for path in folder.iterdir() if _is_log(path.name)]
            record = read_record(folder) if logs else None
            if isinstance(record, JobRecord):  # an unreadable record cannot be dated: its logs stay
                kept.append((record, logs))
    kept.sort(key=lambda entry: entry[0].created_at, reverse=True)
    for record, logs in kept[keep:]:
        if not record.final and (record.owner is None or record.owner.alive()):
            continue  # still running (a long job among many short ones), or a scheduler's: not ours to end
        for path in logs:
            with contextlib.suppress(OSError):
                if path.is_file():
                    path.unlink()
