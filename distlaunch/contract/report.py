"""What a launch returns: per-rank failures, the exit code, restarts. Rendered by the CLI or dumped as JSON."""

from __future__ import annotations

import signal as _signal

from pydantic import BaseModel, Field, computed_field

from distlaunch.contract.causes import explain
from distlaunch.errors import ExitCode


class RankExit(BaseModel):
    """A rank that failed on its own (not one distlaunch stopped)."""

    rank: int
    host: str
    exit_code: int  # as a shell reports it: 128+N when killed by signal N
    signal: str | None = None
    tail: list[str] = Field(default_factory=list)  # its last lines of output
    error: dict[str, str] | None = None  # from its TORCHELASTIC_ERROR_FILE (@record): type, message, frame
    time_s: float = 0.0  # seconds since the attempt started
    at: float = 0.0  # when it ended: wall-clock time, as its host's clock read (how nodes compare failures)

    @property
    def what(self) -> str:
        """'rank 3 on node2 exited with code 1' (or 'was killed by SIGKILL')."""
        how = f"was killed by {self.signal}" if self.signal else f"exited with code {self.exit_code}"
        return f"rank {self.rank} on {self.host} {how}"

    @computed_field
    @property
    def cause(self) -> str | None:
        """A known failure in plain words (contract/causes.py), or None."""
        message = self.error.get("message", "") if self.error else ""
        return explain("\n".join([*self.tail, message]), self.host)


HOST_SILENT_CODE = int(ExitCode.HOST)  # a host went silent mid-run: counted as unreachable
HANG_CODE = int(ExitCode.HANG)  # no progress for --hang-timeout: stacks gathered, every rank stopped


class StackGroup(BaseModel):
    """Ranks whose main threads wait in the same place."""

    where: str
    ranks: list[int]
    hosts: list[str]


class SilentHost(BaseModel):
    """A host whose agent stopped answering (frozen, partitioned) and was given up."""

    host: str
    silent_s: float  # seconds since its last message when it was given up


class HangReport(BaseModel):
    """Where the ranks waited when the job stopped making progress."""

    timeout_s: float
    summary: str  # "ranks 0-2 wait in all_reduce (x.py:42); rank 3 in <module> (x.py:40) on node2"
    folder: str | None  # every rank's full stack, one file per rank; None when it could not be written
    groups: list[StackGroup] = Field(default_factory=list)


class RunReport(BaseModel):
    job_id: str
    exit_code: int
    world_size: int
    restarts: int = 0
    failures: list[RankExit] = Field(default_factory=list)  # root cause first
    interrupted: str | None = None  # "SIGINT" / "SIGTERM" when the user stopped the job
    stopped_by: str | None = None  # per-node mode: what on another node stopped this one (its exit code is ours)
    silent_hosts: list[SilentHost] = Field(default_factory=list)
    unconfirmed_hosts: list[str] = Field(default_factory=list)  # after a second interrupt: not confirmed clean
    hang: HangReport | None = None
    stragglers: int = 0  # processes carrying the job's id that outlived their rank and were ended
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
