"""Recorded jobs as they stand now, whatever runs them: what ``jobs``, ``status``, ``stop`` and ``logs`` call.

Each record's backend (``registry.of_record``) says what its job is doing; a scheduler that cannot be asked
costs a job its news, never the listing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from distlaunch.backends.base import LastKnown, last_known
from distlaunch.backends.output import POLL_S
from distlaunch.backends.registry import of_record
from distlaunch.errors import DistlaunchError, HostError, NoAnswer, UsageError
from distlaunch.jobs.store import JobRecord, Unreadable, find_record, list_records


def list_jobs() -> list[JobRecord | Unreadable]:
    """Every recorded job as it stands now, newest first."""
    out_of_reach: dict[str, DistlaunchError] = {}
    return [r if isinstance(r, Unreadable) else _current_or_last(r, out_of_reach) for r in list_records()]


def _current_or_last(record: JobRecord, out_of_reach: dict[str, DistlaunchError]) -> JobRecord:
    # A scheduler out of reach (no kubectl here, a cluster down) costs one job its news, not the listing:
    # its last known state stands, marked ('distlaunch status' says why). A slurmctld that cannot be reached
    # is asked once per listing, not once per job.
    if record.backend in out_of_reach and not record.final:
        return last_known(record, out_of_reach[record.backend])
    try:
        return of_record(record).current(record)
    except DistlaunchError as exc:
        from distlaunch.slurm.jobstate import SlurmUnanswered

        if isinstance(exc, SlurmUnanswered):
            out_of_reach[record.backend] = exc
        return last_known(record, exc)


def find_job(prefix: str, last_known_ok: bool = False) -> JobRecord:
    """The job with this id or unique id prefix, as it stands now.

    When its scheduler cannot be reached (HostError) that error is raised, or with ``last_known_ok`` the record
    as last known is returned (a ``LastKnown``): ``stop`` still tries the scheduler's own stop command."""
    record = find_record(prefix)
    try:
        return of_record(record).current(record)
    except HostError as exc:
        if not last_known_ok:
            raise
        return last_known(record, exc)


def stop_job(record: JobRecord, timeout: float, checkpoint: bool = False) -> JobRecord:
    """Stop a running job (``checkpoint``: after a checkpoint it saves at its next step) and wait until its record
    says how it ended."""
    if record.final:
        raise UsageError(f"job {record.job_id} is {record.state}, not running", "nothing to stop")
    if isinstance(record, LastKnown):  # its scheduler could not be asked: its own stop command may still work
        record = JobRecord(**record.model_dump(exclude={"unknown"}))
    backend = of_record(record)
    started = time.monotonic()
    if checkpoint:
        backend.checkpoint(record, "stop", timeout)
    else:
        backend.request_stop(record)
    deadline = started + timeout
    while time.monotonic() < deadline:
        now = backend.reread(record)
        if now.final:
            return now
        time.sleep(POLL_S)
    raise NoAnswer(
        f"job {record.job_id} did not confirm its end within {timeout:g}s",
        f"its ranks may still be in their --grace-period: see 'distlaunch status {record.job_id}', "
        "or give a longer --timeout",
    )


def read_lines(
    record: JobRecord,
    follow: bool,
    ranks: set[int],
    tail: int | None = None,
    stderr: bool = False,
    on_end: Callable[[JobRecord], None] | None = None,
) -> Iterator[str]:
    """The job's output lines (only ``ranks``' lines when given; the last ``tail`` of them); with ``follow``,
    then every new one until the job is no longer running (``on_end`` then hears how it ended)."""
    outside = sorted(r for r in ranks if not 0 <= r < record.world_size)
    if outside:  # a rank the job does not have would print nothing, as if it had said nothing
        have = "0" if record.world_size == 1 else f"0-{record.world_size - 1}"
        raise UsageError(
            f"job {record.job_id} has no rank {outside[0]}: its ranks are {have}",
            f"give --rank between 0 and {record.world_size - 1}",
        )
    return of_record(record).lines(record, follow, ranks, tail, stderr, on_end)
