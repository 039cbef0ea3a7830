"""What a launch returns: per-rank failures, the exit code, restarts. Rendered by the CLI or dumped as JSON."""

from __future__ import annotations

import signal as _signal
import time

from pydantic import BaseModel, Field, computed_field

from distlaunch.contract.causes import explain
from distlaunch.contract.inventory import HostInventory
from distlaunch.errors import ExitCode
from distlaunch.readable import plural


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
LOST_AGENT_CODE = 255  # an agent that vanished without reporting its ranks (host down, connection cut)
HANG_CODE = int(ExitCode.HANG)  # no progress for --hang-timeout: stacks gathered, every rank stopped
REQUEUE_CODE = int(ExitCode.SAVED_TO_REQUEUE)  # saved as asked, then stopped: requeue it and it resumes there


class StackGroup(BaseModel):
    """Ranks whose main threads wait in the same place."""

    where: str
    ranks: list[int]
    hosts: list[str]


class StacksSnapshot(BaseModel):
    """Where a running job's ranks were when asked (what ``distlaunch stacks --json`` prints)."""

    job_id: str
    number: int  # stacks-<number>.json in the job's folder
    taken_at: float = Field(default_factory=time.time)
    summary: str  # "ranks 0,2 wait in all_reduce (train.py:42); rank 1 in sleep (train.py:40) on node2"
    groups: list[StackGroup]
    folder: str  # one file per rank with its full stack


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


class AttemptReport(BaseModel):
    """One start of every rank: where it ran, how it ended, and what changed from the attempt before."""

    restart: int  # 0 for the first attempt (TORCHELASTIC_RESTART_COUNT)
    hosts: list[str]
    world_size: int
    layout: str  # the --parallel spelling of the attempt's layout
    dropped: dict[str, str] = Field(default_factory=dict)  # host -> why it left the job before this attempt
    added: list[str] = Field(default_factory=list)  # spares that joined the job for this attempt
    started_at: float = 0.0  # wall clock
    ended_at: float = 0.0
    ended: str = ""  # "finished", or what stopped it: the root cause in a few words
    first_step: int | None = None  # the first training step it completed (progress reports with a step)
    last_step: int | None = None
    step_s: float | None = None  # seconds a step between the first and the last step reported (None: under two)
    cpus: dict[int, str] = Field(default_factory=dict)  # rank -> the CPUs it ran on (its agent's "started")


class FaultCost(BaseModel):
    """The wall time one fault cost, in the order it was spent (seconds; None where it could not be measured)."""

    fault: str  # the attempt's end in a few words
    detection_s: float | None = None  # the fault happened -> distlaunch noticed it
    stopping_s: float = 0.0  # noticed -> every rank stopped
    restart_s: float = 0.0  # stopped -> the next attempt's ranks starting (preflight of its hosts included)
    startup_s: float | None = None  # ranks starting -> their first step done (start-up, checkpoint reload)
    recomputed_steps: int | None = None  # steps done again: those since the checkpoint the next attempt resumed from
    recomputed_s: float | None = None

    @computed_field
    @property
    def lost_s(self) -> float:
        """Everything this fault cost, as far as measured."""
        parts = (self.detection_s, self.stopping_s, self.restart_s, self.startup_s, self.recomputed_s)
        return round(sum(part or 0.0 for part in parts), 3)


class Goodput(BaseModel):
    """How much of the job's wall time ended up as kept training steps (ETTR: effective training time ratio)."""

    wall_s: float
    productive_s: float | None = None  # time of the steps that were kept (None: the ranks report no steps)
    ettr: float | None = None  # productive_s / wall_s
    faults: list[FaultCost] = Field(default_factory=list)


class Straggler(BaseModel):
    """A rank whose own compute (its time outside collectives, as ``distlaunch.progress`` reports it) stayed well
    above the other ranks': not one that merely waits for them."""

    rank: int
    host: str
    factor: float  # its median compute time over the median of the other ranks' (2.1: 2.1 times as long)
    steps: int  # how many of its latest steps that median covers
    step: int | None = None  # the step it had reached when it was named
    attempt: int = 0  # the restart it was named in (0: the first attempt)

    @property
    def what(self) -> str:
        """'rank 1 on node2 computes 2.1× the median of the other ranks over its last 50 steps'."""
        return (
            f"rank {self.rank} on {self.host} computes {self.factor:.1f}× the median of the other ranks "
            f"over its last {plural(self.steps, 'step')}"
        )


class SavedOnRequest(BaseModel):
    """A checkpoint the ranks saved because it was asked of them (launcher/supervising/saves.py)."""

    step: int  # the step every reporting rank saved
    why: str  # who asked: "SIGUSR1", "SIGTERM", "distlaunch checkpoint", "distlaunch stop --checkpoint"
    then: str  # "stop" (the job stopped after it) or "continue"
    save_s: float | None = None  # the save as the slowest rank timed it
    waited_s: float  # from the request to every rank's report of the save


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
    stragglers_found: list[Straggler] = Field(
        default_factory=list
    )  # ranks named slow (launcher/supervising/stragglers.py)
    wall_s: float = 0.0
    attempts: list[AttemptReport] = Field(default_factory=list)
    goodput: Goodput | None = None
    saved_on_request: list[SavedOnRequest] = Field(default_factory=list)
    lost_work: str | None = None  # a stop that could not save first: the work since the last checkpoint, in words
    # what each host that ran ranks reported of itself before they started (hostprobe.py), where it was read
    hosts: dict[str, HostInventory] = Field(default_factory=dict)


def exit_code_of(returncode: int) -> tuple[int, str | None]:
    """Turn a Popen returncode (negative = signal) into a shell exit code and a signal name."""
    if returncode < 0:
        try:
            name = _signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return 128 - returncode, name
    return returncode, None
