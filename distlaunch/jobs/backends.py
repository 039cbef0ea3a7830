"""What each backend does for a recorded job: say what it is doing now, stop it, name its output file.

A job started by ``run``/``train`` (locally or over SSH) is driven by its launcher process, in a terminal or
as a detached supervisor: the record's owner. A Slurm batch job is Slurm's: its state comes from
scontrol/sacct, ``stop`` is scancel, its output is the job's output file. A backend is one class here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from distlaunch.errors import HostError, UsageError
from distlaunch.jobs.store import (
    STOP_FILE,
    JobRecord,
    Unreadable,
    find_record,
    jobs_dir,
    list_records,
    read_record,
    write_record,
)

POLL_S = 0.2
OUTPUT_FILE = "output.log"  # a detached job's terminal output, in its folder
ERRORS_FILE = "errors.log"  # the same job's stderr lines and distlaunch's notices alone


class JobBackend(Protocol):
    def current(self, record: JobRecord) -> JobRecord:
        """The record as the job stands now."""
        ...

    def request_stop(self, record: JobRecord) -> None:
        """Ask the job to stop as Ctrl-C would; the record says when it has."""
        ...

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        """The file that holds the job's output (or its stderr alone)."""
        ...


class LauncherJobs:
    """Jobs driven by a distlaunch launcher process (local and SSH backends, foreground or detached)."""

    def current(self, record: JobRecord) -> JobRecord:
        # "lost": the record says running but its launcher is gone (SIGKILL, reboot); its agents took the ranks.
        if record.state == "running" and record.owner is not None and not record.owner.alive():
            return record.model_copy(update={"state": "lost"})
        return record

    def request_stop(self, record: JobRecord) -> None:
        owner = record.owner
        if owner is None or owner.hostname != os.uname().nodename:
            where = owner.hostname if owner else "an unknown host"
            raise UsageError(f"job {record.job_id} is supervised on {where}", f"run 'distlaunch stop' on {where}")
        (jobs_dir() / record.job_id / STOP_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
        if owner.alive():  # pid and start time both match: never a stranger that reused the pid
            os.kill(owner.pid, signal.SIGTERM)  # the launcher stops every rank: SIGTERM, grace period, SIGKILL

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        path = jobs_dir() / record.job_id / (ERRORS_FILE if stderr else OUTPUT_FILE)
        if not path.exists():
            hint = f"its ranks' logs are in {record.log_dir}" if record.log_dir else "start jobs with --detach"
            raise UsageError(f"job {record.job_id} ran in a terminal: distlaunch kept no output of it", hint)
        return path


# Slurm's states as the registry's: pending and running as they are, the rest by how the job ended.
_SLURM_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "stopped",
}


class SlurmJobs:
    """Batch jobs submitted by ``distlaunch slurm sbatch``: squeue/scontrol, scancel, the job's output file."""

    def current(self, record: JobRecord) -> JobRecord:
        if record.final or record.native_id is None:
            return record
        from distlaunch.slurm.jobstate import exit_code_of, job_state

        try:
            found = job_state(record.native_id)
        except (OSError, subprocess.SubprocessError):
            return record  # no Slurm client here (another login node): the last known state stands
        if found is None:
            return record.model_copy(update={"state": "lost", "error": "Slurm no longer knows this job"})
        slurm_state, code = found
        state = _SLURM_STATES.get(slurm_state, "failed")
        update: dict = {"state": state, "error": None if state != "failed" else f"Slurm state {slurm_state}"}
        if record.final is False and state in ("succeeded", "stopped", "failed"):
            update.update(exit_code=exit_code_of(slurm_state, code), ended_at=time.time())
            now = record.model_copy(update=update)
            write_record(now)  # final: later reads need no Slurm
            return now
        return record.model_copy(update=update)

    def request_stop(self, record: JobRecord) -> None:
        try:
            done = subprocess.run(
                ["scancel", "--full", record.native_id or ""], capture_output=True, text=True, timeout=60, check=False
            )
        except FileNotFoundError:
            raise HostError("'scancel' not found here", "run 'distlaunch stop' on a Slurm login node") from None
        if done.returncode:
            raise HostError(f"scancel {record.native_id} failed: {done.stderr.strip()}", "check it with squeue")

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        if stderr:  # sbatch writes both streams to one file unless the template says otherwise
            raise UsageError(f"job {record.job_id} is a Slurm job: its stderr is in its output file", "drop --stderr")
        if not record.output:
            raise UsageError(f"job {record.job_id} writes per-node or per-task files", "look at its --output files")
        return Path(record.output)


BACKENDS: dict[str, JobBackend] = {"local": LauncherJobs(), "ssh": LauncherJobs(), "slurm": SlurmJobs()}


def backend_of(record: JobRecord) -> JobBackend:
    return BACKENDS.get(record.backend, LauncherJobs())


def list_jobs() -> list[JobRecord | Unreadable]:
    """Every recorded job as it stands now, newest first."""
    return [r if isinstance(r, Unreadable) else backend_of(r).current(r) for r in list_records()]


def find_job(prefix: str) -> JobRecord:
    """The job with this id or unique id prefix, as it stands now."""
    record = find_record(prefix)
    return backend_of(record).current(record)


def stop_job(record: JobRecord, timeout: float) -> JobRecord:
    """Stop a running job and wait until its record says how it ended."""
    if record.final:
        raise UsageError(f"job {record.job_id} is {record.state}, not running", "nothing to stop")
    backend = backend_of(record)
    backend.request_stop(record)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _reread(record)
        if now.final:
            return now
        time.sleep(POLL_S)
    raise UsageError(
        f"job {record.job_id} did not confirm its end within {timeout:.0f}s",
        f"see 'distlaunch status {record.job_id}'",
    )


def _reread(record: JobRecord) -> JobRecord:
    raw = read_record(jobs_dir() / record.job_id)
    return backend_of(record).current(raw if isinstance(raw, JobRecord) else record)


def rank_of(line: str) -> int | None:
    """The rank a printed output line belongs to ('[rank 3] …', '[host rank 3] …' or srun's '3: …')."""
    if line.startswith("["):
        head = line[1 : line.find("]")].split()
        return int(head[-1]) if len(head) >= 2 and head[-2] == "rank" and head[-1].isdigit() else None
    label, colon, _ = line.partition(":")
    return int(label.strip()) if colon and label.strip().isdigit() else None


def read_lines(
    record: JobRecord, follow: bool, keep: Callable[[str], bool], tail: int | None = None, stderr: bool = False
) -> Iterator[str]:
    """The job's output lines that ``keep`` accepts (the last ``tail`` of them); with ``follow``, then every new
    one until the job is no longer running."""
    path = backend_of(record).output(record, stderr)
    if not path.exists():
        if not follow:
            raise UsageError(f"job {record.job_id} has no output yet: {path} does not exist", "try again later")
        while not path.exists() and not _reread(record).final:
            time.sleep(POLL_S)
        if not path.exists():
            return
    with open(path, encoding="utf-8", errors="replace") as f:
        *lines, pending = f.read().split("\n")
        lines = [line for line in lines if keep(line)]
        yield from lines if tail is None else lines[len(lines) - tail :] if tail else []
        while follow:
            chunk = f.read()
            if not chunk:
                if not _reread(record).final:
                    time.sleep(POLL_S)
                    continue
                chunk, follow = f.read(), False  # what the job wrote between the last read and its end
            *lines, pending = (pending + chunk).split("\n")
            yield from (line for line in lines if keep(line))
        if pending and keep(pending):
            yield pending
