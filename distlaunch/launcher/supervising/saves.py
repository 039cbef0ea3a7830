"""Checkpoints on request: the save watch of one attempt.

A save is asked of a running job by the save signal (SIGUSR1: Slurm's warning before a time limit), by SIGTERM when
the save fits in the grace period, or by ``distlaunch checkpoint`` / ``stop --checkpoint``. The watch passes the
request to every agent, which hands it to each rank (``distlaunch.checkpoint_requested()``); the ranks agree on a
step, save it and report it (``distlaunch.progress(saved_step=..., save_s=...)``, whose report names the request
it answered). The save counts as done when every rank that reports checkpoints has answered it. Then the job trains on, or stops:
the ranks get the grace period to end by themselves, and the job exits 75 (saved, requeue it) or, after SIGTERM, 143.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from distlaunch import protocol as p
from distlaunch.contract.report import SavedOnRequest
from distlaunch.launcher.supervising.goodput import StepTimeline
from distlaunch.launcher.supervising.requests import JobRequests, SaveAsk
from distlaunch.launcher.supervising.watch import Agents, Stop, Watch
from distlaunch.readable import plural

SAVE_WAIT_S = 600.0  # a save asked with no deadline of its own: reported within this, or given up
FIT_MARGIN = 1.25  # a save fits in a grace period when a step and the measured save, times this, do


@dataclass
class _Pending:
    """The save under way: its request id (the ranks' reports name the newest they answered) and the asks it
    answers."""

    id: int
    asks: list[SaveAsk]
    asked_at: float  # time.monotonic()
    budget_s: float

    @property
    def then(self) -> str:
        return "stop" if any(a.then == "stop" for a in self.asks) else "continue"

    @property
    def why(self) -> str:
        return " and ".join(dict.fromkeys(a.why for a in self.asks))


@dataclass
class SaveWatch(Watch):
    agents: Agents
    inbox: JobRequests | None
    steps: StepTimeline
    notice: Callable[[str], None]
    grace_period: float
    reports: dict[int, dict] = field(default_factory=dict)  # rank -> its newest progress report
    pending: _Pending | None = None
    saved: list[SavedOnRequest] = field(default_factory=list)
    outcome: tuple[int, str] | None = None  # a stop after the save (or after giving up on it): exit code, why
    # the job stops without a save it asked for (or that did not fit): the report says what that lost, from the
    # ranks' last reports (read as they end; a report read when the stop began may be a second old)
    stopped_unsaved: bool = False
    _next_id: int = 0
    _exit_by: float | None = None  # after a save-and-stop: the ranks end by themselves before this, or are stopped

    def on_event(self, node_rank: int, event: dict) -> None:
        if event.get("ev") != p.PROGRESS:
            return
        for rank, report in (event.get("ranks") or {}).items():
            if isinstance(report, dict):
                self.reports[int(rank)] = report

    def save_s(self) -> float | None:
        """The newest save as the slowest rank timed it (None: no rank timed one)."""
        times = [r["save_s"] for r in self.reports.values() if isinstance(r.get("save_s"), int | float)]
        return max(times) if times else None

    def saved_steps(self) -> dict[int, int | None]:
        """Each reporting rank's newest saved step (None: it reports steps but no checkpoint yet)."""
        steps = {rank: report.get("saved_step") for rank, report in self.reports.items()}
        return {rank: step if isinstance(step, int) else None for rank, step in steps.items()}

    def ask(self, ask: SaveAsk, now: float) -> None:
        """Ask every rank to save at its next step (a save under way answers a second ask as well)."""
        if self.outcome is not None:
            self.inbox_answer(ask, {"error": "the job is stopping already"})
            return
        if self.pending is not None:
            upgrade = ask.then == "stop" and self.pending.then == "continue"
            self.pending.asks.append(ask)
            if not upgrade:
                return
        self._next_id += 1
        budget = ask.budget_s if ask.budget_s is not None else SAVE_WAIT_S
        if self.pending is None:
            self.pending = _Pending(self._next_id, [ask], now, budget)
        else:
            self.pending.id, self.pending.budget_s = self._next_id, min(self.pending.budget_s, budget)
        then = self.pending.then
        self.agents.ask_pending(p.command(p.SAVE, id=self._next_id, then=then, why=self.pending.why))
        also = ", then stop" if then == "stop" else ""
        self.notice(f"{ask.why}: asking every rank to save a checkpoint at its next step{also}")

    def tick(self, now: float) -> Stop | None:
        if self.inbox is not None:
            self.inbox.poll(now)
            while self.inbox.saves:
                self.ask(self.inbox.saves.pop(0), now)
        pending = self.pending
        if pending is not None:
            step = self._answered(pending)
            if step is not None:
                self._done(pending, step, now)
            elif now - pending.asked_at > pending.budget_s:
                return self._give_up(pending)
        if self._exit_by is not None and now > self._exit_by:
            self._exit_by = None
            return Stop(self.outcome[1] if self.outcome else "a save was asked")
        return None

    def _answered(self, pending: _Pending) -> int | None:
        """The step every checkpointing rank saved for this request, once they all have (else None). A report
        says which request the rank's newest save answered: an older save, or the step it resumed from, is no
        answer."""
        saved = {rank: step for rank, step in self.saved_steps().items() if step is not None}
        answers = [
            _answered_step(self.reports[rank], step)
            for rank, step in saved.items()
            if _answered_id(self.reports[rank]) >= pending.id
        ]
        if not answers:
            return None
        # A rank that saved the same step as one that answered took part in that save (a collective one), though
        # its own request file reached it a step later (another host's agent): it counts.
        step = min(answers)
        return step if all(other >= step for other in saved.values()) else None

    def _done(self, pending: _Pending, step: int, now: float) -> None:
        self.pending = None
        save_s = self.save_s()
        record = SavedOnRequest(
            step=step, why=pending.why, then=pending.then, save_s=save_s, waited_s=round(now - pending.asked_at, 3)
        )
        self.saved.append(record)
        for ask in pending.asks:
            self.inbox_answer(ask, {"saved_step": step, "save_s": save_s, "then": pending.then})
        took = f" ({save_s:.1f}s to save)" if save_s is not None else ""
        if pending.then == "stop":
            code = next(a.exit_code for a in pending.asks if a.then == "stop")
            self.outcome = (code, f"the checkpoint of step {step} was saved as asked by {pending.why}")
            self._exit_by = now + self.grace_period
            self.notice(f"saved the checkpoint of step {step}{took}, as asked by {pending.why}; the job stops")
        else:
            self.notice(f"saved the checkpoint of step {step}{took}, as asked by {pending.why}; the job goes on")

    def _give_up(self, pending: _Pending) -> Stop | None:
        self.pending = None
        why = (
            f"no checkpoint was reported within {pending.budget_s:g}s of the request by {pending.why} "
            "(a script saves when distlaunch.checkpoint_requested() says so and reports it with "
            "distlaunch.progress(saved_step=...); distlaunch train needs checkpoint.dir)"
        )
        for ask in pending.asks:
            self.inbox_answer(ask, {"error": why})
        self.notice(why)
        if pending.then != "stop":
            return None
        stop = next(a for a in pending.asks if a.then == "stop")
        self.stopped_unsaved = True
        self.outcome = (stop.fallback_code, f"{stop.why} asked for a save that did not come")
        return Stop("no checkpoint saved")

    def inbox_answer(self, ask: SaveAsk, answer: dict) -> None:
        if self.inbox is not None:
            self.inbox.answer(ask, answer)

    # -- SIGTERM: a save only when it fits -----------------------------------------------------------------------
    def fits(self, budget_s: float) -> str | None:
        """None when a save and a step fit in ``budget_s`` (the measured save time decides); else why not."""
        saved = [step for step in self.saved_steps().values() if step is not None]
        if not saved:
            return "no rank reports checkpoints"
        save_s, step_s = self.save_s(), self.steps.step_s or 0.0
        if save_s is None:
            return "no save of this job has been timed yet"
        need = (save_s + step_s) * FIT_MARGIN
        if need > budget_s:
            return (
                f"a save takes {save_s:.1f}s and a step {step_s:.1f}s, more than fits in the {budget_s:g}s grace period "
                f"(--grace-period {need + 1:.0f} would fit them)"
            )
        return None


def _answered_id(report: dict) -> int:
    answered = report.get("answered")
    return answered if isinstance(answered, int) else 0


def _answered_step(report: dict, saved_step: int) -> int:
    """The step whose save answered the rank's newest request: its newest save may be a later one (a periodic save
    done before the agent read the report again)."""
    step = report.get("answered_step")
    return step if isinstance(step, int) and step <= saved_step else saved_step


def lost_work(steps: StepTimeline) -> str | None:
    """The work since the newest checkpoint, in words (None when the ranks report no steps)."""
    if steps.last_step is None:
        return None
    since = steps.saved_step or 0
    lost = steps.last_step - since
    if lost <= 0:
        return "no step was lost: the newest checkpoint is of the last step"
    seconds = lost * steps.step_s if steps.step_s else None
    about = (
        ""
        if seconds is None
        else f", about {seconds:.1f}s of training"
        if seconds < 10
        else f", about {seconds:.0f}s of training"
    )
    where = f"the checkpoint of step {since}" if since else "the start (no checkpoint yet)"
    return f"the {plural(lost, 'step')} since {where} {'is' if lost == 1 else 'are'} lost{about}"


def time_limit_hint() -> str:
    """Where a SIGTERM may be Slurm's time limit: the flag that would have warned the job in time."""
    if not os.environ.get("SLURM_JOB_ID"):
        return ""
    return (
        "; if this was Slurm's time limit, ask for a warning ahead of it: #SBATCH --signal=B:USR1@LEAD "
        "(distlaunch slurm sbatch writes it)"
    )
