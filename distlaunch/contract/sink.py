"""Where a running job's output goes, and what the job looks like now: the one interface between whatever runs a
job (the launcher, on any backend) and whoever shows it (the CLI's terminal printer, a detached job's log file,
the tests)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel


class JobStatus(BaseModel):
    """A running job at one moment, as its status line shows it."""

    world_size: int
    hosts: int
    elapsed_s: float  # since this attempt started
    started: int = 0  # ranks started so far
    running: int = 0  # ranks started and not exited
    reporter: int | None = None  # the rank the line follows: rank 0, or the lowest that reports progress
    step: int | None = None  # its newest step
    total_steps: int | None = None
    metrics: dict[str, float] = {}  # its newest figures by name: loss, tokens_per_s, mfu (a fraction)
    doing: str | None = None  # what it said it does before its next step ("compiling")
    eta_s: float | None = None  # at the recent step rate; None before two steps a few seconds apart
    since_progress_s: float | None = None  # since the last progress report (None: none came)
    since_output_s: float | None = None  # since the last line of rank output (None: none came)


class Sink(Protocol):
    """Where a running job's output goes (the CLI renders it; tests collect it)."""

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None: ...

    def notice(self, text: str) -> None: ...

    def status(self, state: JobStatus) -> None:
        """The job as it is now (twice a second): a terminal draws it under the output; anything else ignores it."""
