"""Job records on disk: one folder per job under the state directory, one ``job.json`` in each.

    $DISTLAUNCH_STATE_DIR            (default $XDG_STATE_HOME/distlaunch, else ~/.local/state/distlaunch)
    └── jobs/dl-3f9a0c1d2e4b/
        ├── job.json                 (a JobRecord; replaced atomically on every change)
        └── rank0.log, rank0.log.1   (each rank's output and its previous part, without --log-dir: jobs/logs.py)

Writers replace the file with ``os.replace`` of a fully written temporary file, so a reader sees the
old record or the new one, never half of one. A record that cannot be parsed anyway (a full disk, a
hand edit) is reported as unreadable instead of breaking the listing, and so is one that parses but
holds what no writer writes (a time no clock reads, a plan or report of another shape, another job's id):
every reader after ``read_record`` may trust a record's fields. Records are raw here; the job's backend
(``distlaunch.backends``) says what the job is doing now.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from distlaunch.contract.report import AttemptReport, Goodput, RunReport, Straggler
from distlaunch.errors import UsageError, validation_problem
from distlaunch.files import open_regular

STATE_VAR = "DISTLAUNCH_STATE_DIR"
RECORD = "job.json"
RESERVE = ".reserve"  # space a running job holds in its folder, so that its last record lands on a disk it filled
OUTPUT_FILE = "output.log"  # a detached job's terminal output, in its folder
ERRORS_FILE = "errors.log"  # the same job's stderr lines and distlaunch's notices alone
LAUNCH_FILE = "launch.json"  # a detached job's plan and options, for its supervisor: only detached jobs have one
STOP_FILE = "stop-requested"  # written by 'distlaunch stop' before it signals the job: the end reads "stopped"
JobState = Literal["pending", "running", "succeeded", "failed", "interrupted", "stopped", "lost"]
FINAL_STATES = ("succeeded", "failed", "interrupted", "stopped")
# A detached job's folder exists a moment before its supervisor writes the record (launcher/running/detach.py waits
# START_TIMEOUT_S for it, then removes the folder): a listing meanwhile leaves such a folder out.
STARTING_S = 30.0


class Owner(BaseModel):
    """The process that runs the job and keeps its record: pid plus start time, so a reused pid is no match."""

    pid: int = Field(ge=1)  # never 0 or -1: to a signal those mean a whole process group, or every process
    start_ticks: int
    hostname: str

    @classmethod
    def me(cls) -> Owner:
        return cls(pid=os.getpid(), start_ticks=_start_ticks(os.getpid()) or 0, hostname=os.uname().nodename)

    def alive(self) -> bool:
        """Whether that process still runs (only answerable on its own machine: elsewhere, assume it does)."""
        if self.hostname != os.uname().nodename:
            return True
        return _start_ticks(self.pid) == self.start_ticks


# A wall-clock time as a record holds it: seconds since 1970, up to the last second of year 9999 (what
# time.localtime and the ages in 'distlaunch jobs' can show; inf or NaN would break them).
Timestamp = Annotated[float, Field(ge=0, le=253402300799, allow_inf_nan=False)]


class _PlanRank(BaseModel):
    rank: int


class _PlanNode(BaseModel):
    host: str
    node_rank: int
    ranks: list[_PlanRank]
    state: str | None = None  # a Kubernetes pod's phase


class _RecordPlan(BaseModel):
    """What ``status``, ``logs`` and the scheduler backends read of a record's plan; the rest is kept as written."""

    nodes: list[_PlanNode] = []
    parallel: dict[str, Any] = {}
    nnodes: int | None = None
    nproc_per_node: int | None = None


def _checked_as(model: type[BaseModel]) -> AfterValidator:
    """A dict field kept as written, once it reads as ``model`` (its first problem is the record's)."""

    def check(value: dict | None) -> dict | None:
        if value is not None:
            try:
                model.model_validate(value)
            except ValidationError as err:
                raise ValueError(validation_problem(err)) from None
        return value

    return AfterValidator(check)


class JobRecord(BaseModel):
    """What distlaunch knows about one job, for ``jobs`` and ``status``."""

    job_id: str
    backend: str  # local, ssh, slurm, ...
    command: list[str]  # the distlaunch command line that started it
    cwd: str
    hosts: list[str]
    world_size: int
    state: JobState = "running"
    created_at: Timestamp = Field(default_factory=time.time)
    ended_at: Timestamp | None = None
    exit_code: int | None = None
    restarts: int = 0
    owner: Owner | None = None
    log_dir: str | None = None  # --log-dir as given
    rank_logs: str | None = None  # the folder of its rank<N>.log files (its --log-dir folder, or its own here)
    plan: Annotated[dict, _checked_as(_RecordPlan)] = Field(default_factory=dict)  # the masked LaunchPlan
    report: Annotated[dict | None, _checked_as(RunReport)] = None  # the RunReport once the job ended
    # While it runs, after each attempt that did not finish: every attempt so far and what the faults cost
    # (RunReport's ``attempts`` and ``goodput``; the plan and hosts become the next attempt's)
    attempts: list[AttemptReport] = Field(default_factory=list)
    goodput: Goodput | None = None
    # ranks named slow while it runs: read from the job folder's stragglers.json (launcher/supervising/stragglers.py), which its
    # launcher writes the moment it names one; the report has them too once the job ended
    stragglers_found: list[Straggler] = Field(default_factory=list)
    error: str | None = None  # why it ended without a report (a host failed in preflight, ...)
    native_id: str | None = None  # the scheduler's own id (Slurm job id, Kubernetes Job name)
    output: str | None = None  # the scheduler's output file
    namespace: str | None = None  # a Kubernetes job's namespace (None: kubectl's current one)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES or self.state == "lost"


class Unreadable(BaseModel):
    """A job folder whose record is missing or cannot be parsed: listed with the reason, never dropped."""

    job_id: str
    state: Literal["unreadable"] = "unreadable"
    problem: str  # one short line: "job.json is not valid JSON (...)", "job.json is missing", ...


def state_dir(environ: dict[str, str] | None = None) -> Path:
    """Where job records live: $DISTLAUNCH_STATE_DIR, else $XDG_STATE_HOME/distlaunch, else ~/.local/state/distlaunch."""
    env = os.environ if environ is None else environ
    if env.get(STATE_VAR):
        return Path(env[STATE_VAR])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "distlaunch"
    return Path.home() / ".local" / "state" / "distlaunch"


def jobs_dir() -> Path:
    return state_dir() / "jobs"


def job_folder(job_id: str) -> Path:
    """The folder of one job in the store: its record and what it keeps beside it. The one place its path is built."""
    return jobs_dir() / job_id


def write_record(record: JobRecord) -> Path:
    """Create or replace a job's record atomically (a reader never sees half of it)."""
    folder = job_folder(record.job_id)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".job-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(record.model_dump_json(indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / RECORD)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return folder / RECORD


def hold_space(job_id: str, nbytes: int) -> bool:
    """Set ``nbytes`` aside in the job's folder while it runs (False when the disk has no room even now).

    A job often fills the disk its state directory is on (checkpoints, logs in the home folder): its end must
    still be recorded, or a finished job reads as lost. ``free_space`` gives the bytes back just before."""
    path = job_folder(job_id) / RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, nbytes)  # real blocks (not a sparse file), on every file system
        return True
    except OSError:
        free_space(job_id)
        return False
    finally:
        os.close(fd)


def free_space(job_id: str) -> None:
    """Give back what ``hold_space`` set aside."""
    with contextlib.suppress(OSError):
        (job_folder(job_id) / RESERVE).unlink()


def read_record(folder: Path) -> JobRecord | Unreadable:
    """One job's record, or what is wrong with it (one short line)."""
    try:
        with open(open_regular(folder / RECORD), "rb") as f:  # a pipe must not hold up the listing of every job
            raw = f.read()
    except FileNotFoundError:
        return Unreadable(job_id=folder.name, problem=f"{RECORD} is missing")
    except OSError as exc:
        return Unreadable(job_id=folder.name, problem=f"{RECORD} cannot be read: {exc.strerror or exc}")
    try:
        record = JobRecord.model_validate_json(raw)
    except ValidationError as exc:
        return Unreadable(job_id=folder.name, problem=f"{RECORD} is not a job record: {validation_problem(exc)}")
    if record.job_id != folder.name:  # its writers would write to that other job's folder
        return Unreadable(
            job_id=folder.name, problem=f"{RECORD} is not this job's record: it names job {record.job_id!r}"
        )
    return record


def list_records() -> list[JobRecord | Unreadable]:
    """Every job under the state directory, newest first; unreadable records last, except a folder that a
    detached job's supervisor is still starting in (no record yet, and only seconds old)."""
    root = jobs_dir()
    if not root.is_dir():
        return []
    records = [read_record(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    good = sorted((r for r in records if isinstance(r, JobRecord)), key=lambda r: r.created_at, reverse=True)
    bad = [r for r in records if isinstance(r, Unreadable) and not _starting(root / r.job_id, r)]
    return good + sorted(bad, key=lambda r: r.job_id)


def _starting(folder: Path, record: Unreadable) -> bool:
    if record.problem != f"{RECORD} is missing":
        return False
    try:
        return time.time() - folder.stat().st_mtime < STARTING_S
    except OSError:
        return True  # gone since it was listed: removed by a detach that failed


def find_record(prefix: str) -> JobRecord:
    """The one job whose id starts with ``prefix`` (a unique prefix is enough, as with git)."""
    root = jobs_dir()
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    # An exact id, a unique prefix of one, or a scheduler's own id (Slurm's 1234 for slurm-1234, a Job's name).
    own = (prefix, f"slurm-{prefix}", f"k8s-{prefix}")
    matches = [n for n in names if n in own] or [n for n in names if n.startswith(prefix)]
    if not prefix or not matches:
        raise UsageError(f"no job {prefix!r} under {root}", "list the jobs with 'distlaunch jobs --all'")
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
        raise UsageError(f"job id prefix {prefix!r} is ambiguous: {shown}", "give more characters of the id")
    record = read_record(root / matches[0])
    if isinstance(record, Unreadable):
        raise UsageError(f"job {record.job_id}: {record.problem}", f"look at {root / record.job_id / RECORD}")
    return record


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None when there is no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its closing one.
    fields = stat.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):  # dead, not yet reaped by its parent
        return None
    return int(fields[19])


def dumps(records: list[JobRecord | Unreadable]) -> str:
    """JSON for ``jobs --json``: a list of records (unreadable ones as {job_id, state: "unreadable", problem})."""
    return json.dumps([r.model_dump() for r in records], indent=2)
