"""What one attempt leaves behind once its loop has ended: what a recovery policy reads (``end``), and what the
job's report and goodput read of it (``ending``, ``times``)."""

from __future__ import annotations

from dataclasses import dataclass

from distlaunch.contract.report import AttemptReport, SavedOnRequest, Straggler
from distlaunch.launcher.supervising.goodput import AttemptTimes, StepTimeline
from distlaunch.launcher.supervising.recovery import AttemptEnd


@dataclass
class AttemptOutcome:
    """How one attempt ended and what it did meanwhile. Times are wall clock; ``stopped_at``: when every agent
    was told to stop (None: never); ``save_outcome``: a stop after a save asked for (or for want of one), as
    its exit code and why; ``stopped_unsaved``: the job stops without a save it asked for, or one that did not fit."""

    end: AttemptEnd
    restart_count: int
    dropped: dict[str, str]  # what changed since the attempt before (NextAttempt)
    added: list[str]
    started_at: float
    ended_at: float
    stopped_at: float | None
    unconfirmed: list[str]  # hosts whose ranks could not be confirmed stopped
    stragglers: int  # processes of this job that outlived their rank's process group, ended by agents
    stragglers_found: list[Straggler]
    steps: StepTimeline
    saved: list[SavedOnRequest]
    save_outcome: tuple[int, str] | None
    stopped_unsaved: bool
    cpus: dict[int, str]  # rank -> the CPUs its agent placed it on (placement.py)

    def ending(self) -> str:
        """How the attempt ended, in a few words."""
        end = self.end
        if end.hang is not None:
            return "hung"
        if end.silent:
            return f"{', '.join(s.host for s in end.silent)} went silent"
        if end.failures:
            return end.failures[0].what
        if end.quarantine:
            return "; ".join(f"{host}: {why}" for host, why in end.quarantine.items())
        if self.save_outcome is not None:  # stopped after a save it was asked for (or for want of one)
            return self.save_outcome[1]
        return "stopped" if self.stopped_at is not None else "finished"

    def times(self) -> AttemptTimes:
        """The attempt as the report lists it, and when its fault happened (the root cause's exit; the last
        message of a host given up; the last progress before a hang)."""
        end, plan = self.end, self.end.plan
        fault_at = None  # a silent host or a hang is detected a timeout after it happened, whatever failed since
        if end.silent and self.stopped_at is not None:
            fault_at = self.stopped_at - max(s.silent_s for s in end.silent)
        elif end.hang is not None and self.stopped_at is not None:
            fault_at = self.stopped_at - end.hang.timeout_s
        elif end.failures:
            fault_at = end.failures[0].at
        report = AttemptReport(
            restart=self.restart_count,
            hosts=[node.host for node in plan.nodes],
            world_size=plan.world_size,
            layout=str(plan.parallel),
            dropped=self.dropped,
            added=self.added,
            started_at=self.started_at,
            ended_at=self.ended_at,
            ended=self.ending(),
            first_step=self.steps.first_step,
            last_step=self.steps.last_step,
            step_s=self.steps.step_s,
            cpus=self.cpus,
        )
        return AttemptTimes(report, self.steps, fault_at, self.stopped_at)
