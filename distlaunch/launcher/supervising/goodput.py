"""Goodput: how much of a job's wall time ended up as kept training steps, and what each fault cost.

Each attempt keeps a ``StepTimeline`` (a watch): the steps its ranks report through ``distlaunch.progress``
(the engine reports every step; a script may too) and the last checkpoint step they saved. After the job,
``account`` puts the attempts side by side. A fault's cost is split the way an operator reads it:

- detection: from the fault (the root cause's exit, a host's last message, the last progress before a hang) to
  distlaunch noticing it;
- stopping: from then until every rank of the attempt had stopped;
- restart: from then until the next attempt's ranks were starting (preflight of its hosts included);
- start-up: from then until the next attempt completed its first step (imports, rendezvous, checkpoint reload);
- recomputed: the steps done since the checkpoint the next attempt resumed from, at the attempt's step time.

Productive time is the kept steps at their attempt's step time; ETTR is productive time over wall time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distlaunch import protocol as p
from distlaunch.contract.report import AttemptReport, FaultCost, Goodput
from distlaunch.launcher.supervising.watch import Watch


@dataclass
class StepTimeline(Watch):
    """The steps one attempt's ranks reported (wall-clock times from the ranks themselves)."""

    first_step: int | None = None
    first_at: float | None = None
    last_step: int | None = None
    last_at: float | None = None
    saved_step: int | None = None  # the newest checkpoint any rank reported saved
    seen: set[int] = field(default_factory=set)

    def on_event(self, node_rank: int, event: dict) -> None:
        if event.get("ev") != p.PROGRESS:
            return
        for report in (event.get("ranks") or {}).values():
            if isinstance(report, dict):
                self.take(report)

    def take(self, report: dict) -> None:
        """One rank's progress report: ``step``, ``at`` (its wall clock), ``saved_step``; any may be missing."""
        step, at, saved = report.get("step"), report.get("at"), report.get("saved_step")
        if isinstance(saved, int) and (self.saved_step is None or saved > self.saved_step):
            self.saved_step = saved
        if not isinstance(step, int) or not isinstance(at, (int, float)):
            return
        if self.first_step is None or step < self.first_step:
            self.first_step, self.first_at = step, float(at)
        if self.last_step is None or step > self.last_step:
            self.last_step, self.last_at = step, float(at)

    @property
    def step_s(self) -> float | None:
        """Seconds per step, measured over this attempt's reported steps (None under two distinct steps)."""
        if self.first_step is None or self.last_step is None or self.last_step <= self.first_step:
            return None
        return (self.last_at - self.first_at) / (self.last_step - self.first_step)


@dataclass
class AttemptTimes:
    """What ``account`` needs of one attempt."""

    report: AttemptReport
    steps: StepTimeline
    fault_at: float | None  # when its fault happened (wall clock); None: it finished, or unknown
    detected_at: float | None  # when distlaunch decided to stop it (None: it was never stopped)


def account(attempts: list[AttemptTimes], wall_s: float) -> Goodput:
    """The job's goodput from its attempts, in order."""
    faults: list[FaultCost] = []
    resume = 0  # the step the current attempt resumed after (0: from scratch)
    productive, measured = 0.0, False
    fallback = next((a.steps.step_s for a in attempts if a.steps.step_s), None)
    for i, attempt in enumerate(attempts):
        steps = attempt.steps
        step_s = steps.step_s or fallback
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        kept_until = steps.last_step or resume
        if nxt is not None:
            kept_until = max(resume, steps.saved_step or resume)  # what the next attempt resumes from
            faults.append(_cost(attempt, nxt, resume, kept_until, step_s))
        if step_s is not None and steps.last_step is not None:
            productive += max(0, kept_until - resume) * step_s
            measured = True
        resume = kept_until
    productive_s = round(productive, 3) if measured else None
    ettr = round(productive / wall_s, 4) if measured and wall_s > 0 else None
    return Goodput(wall_s=wall_s, productive_s=productive_s, ettr=ettr, faults=faults)


def _cost(attempt: AttemptTimes, nxt: AttemptTimes, resume: int, kept_until: int, step_s: float | None) -> FaultCost:
    """What the fault that ended ``attempt`` cost, up to ``nxt``'s first step."""
    report, steps = attempt.report, attempt.steps
    detected = attempt.detected_at if attempt.detected_at is not None else report.ended_at
    detection = detected - attempt.fault_at if attempt.fault_at is not None else None
    recomputed = max(0, (steps.last_step or kept_until) - kept_until)
    startup = None
    if nxt.steps.first_at is not None:
        startup = nxt.steps.first_at - nxt.report.started_at
        if step_s is not None and nxt.steps.first_step is not None:  # its first reported step may not be its first
            startup -= max(0, nxt.steps.first_step - (kept_until + 1)) * step_s
    return FaultCost(
        fault=report.ended,
        detection_s=_round(max(detection, 0.0)) if detection is not None else None,
        stopping_s=_round(max(report.ended_at - detected, 0.0)),
        restart_s=_round(max(nxt.report.started_at - report.ended_at, 0.0)),
        startup_s=_round(max(startup, 0.0)) if startup is not None else None,
        recomputed_steps=recomputed if steps.last_step is not None else None,
        recomputed_s=_round(recomputed * step_s) if step_s is not None and steps.last_step is not None else None,
    )


def _round(seconds: float) -> float:
    return round(seconds, 3)
