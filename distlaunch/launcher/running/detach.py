"""Detached jobs: ``run --detach`` hands the plan to a supervisor process that outlives the terminal.

The supervisor is ``python -m distlaunch.supervisor JOB_DIR``, started in a session of its own (no
controlling terminal, so closing the terminal sends it nothing). It runs exactly the plan the command built
and checked, through the same ``launch`` as a foreground run, so it keeps every guarantee of one: fail-fast,
restarts, no orphans, the root-cause report. What it would have printed goes to ``output.log`` in the job's
folder; ``distlaunch logs`` reads it back.

    launch.json   the plan and options (0600: the plan holds the ranks' environment)
    output.log    rank-prefixed output, notices and the final report
    errors.log    the ranks' stderr lines and distlaunch's notices alone
    job.json      the record (written by the journal inside ``launch``)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from distlaunch.contract.options import ExecOptions, LaunchOptions
from distlaunch.errors import DistlaunchError, UsageError
from distlaunch.jobs.store import LAUNCH_FILE, OUTPUT_FILE, STATE_VAR, JobRecord, job_folder, read_record
from distlaunch.launcher.planning.plan import LaunchPlan

SUPERVISOR = "distlaunch.supervisor"  # the program the supervisor is: an entry point, beside the CLI
START_TIMEOUT_S = 15.0  # the supervisor records the job at once; this only bounds a broken start


class DetachedLaunch(BaseModel):
    """Everything the supervisor needs, as the foreground command resolved it."""

    plan: LaunchPlan
    opts: LaunchOptions
    exec_opts: ExecOptions
    command: list[str]


def detach(launch: DetachedLaunch) -> JobRecord:
    """Start the supervisor for ``launch`` and return the job's first record once it has written it.

    A detach that fails leaves nothing behind: no supervisor, no job folder."""
    folder = _job_folder(launch.plan.job_id)
    proc = None
    try:
        try:
            fd = os.open(folder / LAUNCH_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(launch.model_dump_json())
            out = open(folder / OUTPUT_FILE, "ab")  # noqa: SIM115 - closed below, once the supervisor has it
        except OSError as exc:  # a full disk, a folder that went read-only
            raise _cannot_keep(folder, exc) from None
        with open(os.devnull, "rb") as devnull, out:
            proc = subprocess.Popen(
                [sys.executable, "-m", SUPERVISOR, str(folder)],
                stdin=devnull,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no controlling terminal: closing it (SIGHUP) reaches the job no more
                # Where the command was typed, as a foreground launcher: the ranks' --workdir is in the plan.
                cwd=os.getcwd(),
            )
        return _first_record(folder, proc, launch.plan.job_id)
    except BaseException:
        _discard(folder, proc)
        raise


def _job_folder(job_id: str) -> Path:
    """A new, private folder for the job (exit 2 when the state directory cannot hold one)."""
    folder = job_folder(job_id)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            raise UsageError(f"job {job_id} exists already", "start the job again: it draws a new id") from None
    except OSError as exc:  # a path through a regular file, a read-only or full file system
        raise _cannot_keep(folder, exc) from None
    return folder


def _cannot_keep(folder: Path, exc: OSError) -> UsageError:
    return UsageError(
        f"cannot keep detached job {folder.name} in {folder.parent}: {exc.strerror or exc}"
        + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder.parent) else ""),
        f"a detached job needs a writable state directory: set {STATE_VAR} to a writable folder, "
        "or run without --detach",
    )


def _first_record(folder: Path, proc: subprocess.Popen, job_id: str) -> JobRecord:
    """The record the supervisor writes as the job starts (it may have ended already: a short job)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        ended = proc.poll() is not None  # before the read: a supervisor that wrote its record, then ended
        record = read_record(folder)
        if isinstance(record, JobRecord):
            return record
        if ended:
            break
        time.sleep(0.05)
    tail = _tail(folder / OUTPUT_FILE)
    raise DistlaunchError(
        f"the supervisor of job {job_id} did not start: {tail or 'no output'}",
        "this is a distlaunch bug: run the same command without --detach to see the whole error",
        exit_code=1,
    )


def _discard(folder: Path, proc: subprocess.Popen | None) -> None:
    """Undo a detach that failed: end the supervisor (its ranks die with it) and remove the job's folder."""
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session and process group: start_new_session
        proc.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
