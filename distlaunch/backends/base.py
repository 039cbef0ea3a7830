"""One backend's whole lifecycle, and what ``run``/``train`` and the submitting commands hand a backend.

A backend is ``Backend[P]``, P the type of the plans it makes (``contract.plan.Plan``); the commands read a plan
through that protocol only. A method a backend cannot honour says so in one line (exit 2) with what to do
instead, so every command works on every recorded job, whatever ran it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TextIO, TypeVar

from pydantic import BaseModel

from distlaunch.contract.options import ExecOptions, LaunchOptions, NodeOptions
from distlaunch.contract.plan import Plan
from distlaunch.contract.sink import Sink
from distlaunch.errors import DistlaunchError, HostError, UsageError
from distlaunch.jobs.store import JobRecord, job_folder, read_record, write_record

if TYPE_CHECKING:
    from distlaunch.contract.report import RunReport, StacksSnapshot


class LaunchRequest(BaseModel):
    """What the user asked for, as ``run`` and ``train`` resolved it from the command line."""

    opts: LaunchOptions
    exec_opts: ExecOptions = ExecOptions()
    node: NodeOptions | None = None  # per-node mode: --nnodes / --node-rank / --rdzv-endpoint
    launcher: str = "auto"  # --launcher: auto | slurm | agent
    command: list[str] = []  # the command line, kept in the job record
    supervision_given: list[str] = []  # supervision flags typed on the command line (--hang-timeout, ...)
    dry_run: bool = False  # --dry-run: plan only, contacting no host
    probe: bool = (
        False  # --dry-run --probe: the launch's preflight reads the hosts, then the plan shows their decisions
    )


PlanT = TypeVar("PlanT", bound=Plan)  # what a backend's plan() makes and its run() and detach() take
RequestT = TypeVar("RequestT")  # what a scheduler is handed, as the backend's own model


class Submission(BaseModel, Generic[RequestT]):
    """A job as its scheduler would be handed it (a batch script, Kubernetes objects), checked as a submit checks
    it: what a submitting command's --dry-run prints, and what ``Backend.submit`` hands over."""

    request: RequestT  # the backend's own: what submit needs (the resolved job, its options)
    text: str  # as the scheduler reads it: what --dry-run prints
    data: Any  # the same as JSON-ready data: what --dry-run --json prints


class CheckpointSaved(BaseModel):
    """A checkpoint a running job saved because ``distlaunch checkpoint`` / ``stop --checkpoint`` asked."""

    job_id: str
    step: int  # the step every rank saved
    save_s: float | None = None  # how long the save took, as the slowest rank timed it
    then: str  # "continue": the job trains on; "stop": it stops (exit 75)


class LastKnown(JobRecord):
    """A job's record as last known, when its scheduler cannot be asked now: ``unknown`` says why. Its state is
    the last one seen, not necessarily the job's now (``jobs`` marks it, ``jobs --json`` carries ``unknown``)."""

    unknown: str


def last_known(record: JobRecord, problem: DistlaunchError) -> LastKnown:
    return LastKnown(**record.model_dump(), unknown=problem.message)


def remember(record: JobRecord, now: JobRecord) -> JobRecord:
    """Keep what the scheduler said last (state, nodes) in the record when it changed: while the scheduler cannot
    be asked, that is the state shown, marked as last known."""
    if (now.state, now.hosts, now.plan) == (record.state, record.hosts, record.plan):
        return now
    on_disk = read_record(job_folder(record.job_id))
    if isinstance(on_disk, JobRecord) and not on_disk.final:  # never over a final record written meanwhile
        with contextlib.suppress(OSError):  # a state directory that cannot be written costs the memory only
            write_record(now)
    return now


class Backend(Generic[PlanT]):
    """A way of running a job. ``run``/``train`` use check → plan → run (or detach); ``slurm sbatch`` and ``k8s
    submit`` use submission → submit; the job commands use current, request_stop, lines and stacks on the job's
    record."""

    name: ClassVar[str]  # as messages name it
    records: ClassVar[tuple[str, ...]] = ()  # the JobRecord.backend values of the jobs this backend runs

    # -- a job started by run/train --------------------------------------------------------------------------

    def check(self, request: LaunchRequest, detach: bool) -> None:
        """Refuse options this backend cannot honour, before anything starts (one line, exit 2)."""
        if detach:
            raise UsageError(
                f"--detach is not available for a {self.name} launch",
                "run it in the foreground, in the background with your own tools (nohup, your container)",
            )

    def plan(self, request: LaunchRequest) -> PlanT:
        """What would start, checked as a real run checks it (what --dry-run prints)."""
        raise UsageError(f"a {self.name} job is not started by run or train", "submit it with its own command")

    def run(self, request: LaunchRequest, plan: PlanT, sink: Sink) -> RunReport:
        """Start ``plan``, stream rank output to ``sink``, and say how the job ended."""
        raise UsageError(f"a {self.name} job is not started by run or train", "submit it with its own command")

    def detach(self, request: LaunchRequest, plan: PlanT) -> JobRecord:
        """Hand ``plan`` to a supervisor in the background and return the job's record."""
        raise AssertionError("check() refuses --detach for this backend")  # pragma: no cover

    # -- a job handed to a scheduler (slurm sbatch, k8s submit) ----------------------------------------------

    def submission(self, options: Mapping[str, Any]) -> Submission:
        """What its scheduler would be handed for ``options`` (each option's value by name, as the command parsed
        it), checked before anything is submitted: what the command's --dry-run prints."""
        raise UsageError(f"a {self.name} job is not submitted to a scheduler", "start it with distlaunch run or train")

    def submit(self, submission: Submission, out: TextIO, command: list[str]) -> BaseModel:
        """Hand ``submission`` to the scheduler and record the job (``command``: the command line, kept in its
        record); the scheduler's answer, as the command shows it. ``out``: where a job followed to its end
        writes its output."""
        raise UsageError(f"a {self.name} job is not submitted to a scheduler", "start it with distlaunch run or train")

    # -- a recorded job ----------------------------------------------------------------------------------------

    def current(self, record: JobRecord) -> JobRecord:
        """The record as the job stands now."""
        return record

    def reread(self, record: JobRecord) -> JobRecord:
        """The job as it stands now, read afresh; while its scheduler cannot be asked, as last known."""
        raw = read_record(job_folder(record.job_id))
        raw = raw if isinstance(raw, JobRecord) else record
        try:
            return self.current(raw)
        except HostError as exc:
            return last_known(raw, exc)

    def request_stop(self, record: JobRecord) -> None:
        """Ask the job to stop as Ctrl-C would; the record says when it has."""
        raise UsageError(f"job {record.job_id} ({self.name}) cannot be stopped by distlaunch", "stop it where it runs")

    def checkpoint(self, record: JobRecord, then: str, timeout: float) -> CheckpointSaved:
        """Ask the running job to save a checkpoint at its next step, then go on (``then`` continue) or stop; wait
        up to ``timeout`` seconds for the save."""
        raise UsageError(
            f"job {record.job_id} ({self.name}) cannot be asked for a checkpoint by distlaunch",
            "save where it runs; for distlaunch train, checkpoint.every saves on a schedule",
        )

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        """The job's output lines (only ``ranks``' when given, the last ``tail``); ``follow``: until it ends,
        and then ``on_end`` hears of the record as it ended (where the backend can tell)."""
        raise UsageError(f"distlaunch keeps no output of job {record.job_id} ({self.name})", "look where it ran")

    def stacks(self, record: JobRecord, timeout: float) -> StacksSnapshot:
        """Every rank's stack, taken now, the job running on."""
        raise UsageError(
            f"job {record.job_id} is a {self.name} job: distlaunch stacks reaches only jobs of run and train",
            "run py-spy dump --pid PID where its ranks run",
        )
