"""What a launch returns: per-rank failures, the exit code, restarts. Rendered by the CLI or dumped as JSON."""

from __future__ import annotations

import signal as _signal

from pydantic import BaseModel, Field


class RankExit(BaseModel):
    """A rank that failed on its own (not one distlaunch stopped)."""

    rank: int
    host: str
    exit_code: int  # as a shell reports it: 128+N when killed by signal N
    signal: str | None = None
    tail: list[str] = Field(default_factory=list)  # its last lines of output
    time_s: float = 0.0  # seconds since the attempt started


class RunReport(BaseModel):
    job_id: str
    exit_code: int
    world_size: int
    restarts: int = 0
    failures: list[RankExit] = Field(default_factory=list)  # root cause first
    interrupted: str | None = None  # "SIGINT" / "SIGTERM" when the user stopped the job
    wall_s: float = 0.0


def exit_code_of(returncode: int) -> tuple[int, str | None]:
    """Turn a Popen returncode (negative = signal) into a shell exit code and a signal name."""
    if returncode < 0:
        try:
            name = _signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return 128 - returncode, name
    return returncode, None
