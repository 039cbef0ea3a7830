"""How an attempt meets a stop from outside its ranks: a stop distlaunch itself asked for, a first signal (for a
SIGTERM, a checkpoint first where it fits in the grace period), a second signal that kills every rank at once."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from distlaunch import protocol as p
from distlaunch.launcher.running.context import JobContext
from distlaunch.launcher.supervising.requests import SaveAsk
from distlaunch.launcher.supervising.saves import SaveWatch, time_limit_hint
from distlaunch.launcher.supervising.watch import Agents

KILL_CONFIRM_S = 1.5  # after a second interrupt: how long agents get to confirm before we leave


class Interruptions:
    """Asked on every turn of the attempt's loop (``check``) what the signals and stop requests so far mean for
    it; ``stop`` stops every rank, saying why."""

    def __init__(self, job: JobContext, agents: Agents, saves: SaveWatch, stop: Callable[[str], None]):
        self.job, self.agents, self.saves, self.stop = job, agents, saves, stop
        self.seen = False  # a signal came and was handled
        self.saving = False  # a SIGTERM came and the save it asked for is under way
        self.kill_deadline: float | None = None  # set by a second interrupt, when every agent is told to kill

    def kill_overdue(self, now: float) -> bool:
        """Every agent was told to kill its ranks, and the time to confirm it is up (``now``: time.monotonic())."""
        return self.kill_deadline is not None and now > self.kill_deadline

    def check(self) -> None:
        """A stop asked by distlaunch, or a signal: stop every rank; a second signal: kill them at once."""
        interrupts, stop_request = self.job.interrupts, self.job.stop_request
        if stop_request is not None and stop_request.reason is not None:
            self.stop(stop_request.reason)
        if interrupts.first is None:
            return
        name = signal.Signals(interrupts.first).name
        if self.saving:
            pass  # the save its SIGTERM asked for is under way: the save watch stops the job after it
        elif not self.agents.stopping:
            self.saving = self.save_before_stopping(name)
            if not self.saving:
                self.stop(f"received {name}")
        elif not self.seen:  # a stop under way (a rank failed): say the signal came, and what a second does
            self.job.sink.notice(f"received {name}; already stopping all ranks (a second Ctrl-C kills them at once)")
        self.seen = True
        if interrupts.count > 1 and self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + KILL_CONFIRM_S
            self.job.sink.notice("second interrupt: killing all ranks now")
            self.agents.send_all(p.command(p.KILL))

    def save_before_stopping(self, name: str) -> bool:
        """A first SIGTERM (a preemption, an eviction, a time limit) to a job whose ranks save checkpoints: ask for
        a save and stop after it when it fits in the grace period; else say what the stop without it loses."""
        if name != "SIGTERM" or self.job.interrupts.count > 1 or self.saves.outcome is not None:
            return False
        if self.saves.inbox is not None and self.saves.inbox.stopped_by_command():
            return False  # 'distlaunch stop' stops as Ctrl-C does; 'stop --checkpoint' is the one that saves
        grace_period = self.job.options.grace_period
        unfit = self.saves.fits(grace_period)
        if unfit is None:
            ask = SaveAsk("stop", name, exit_code=128 + signal.SIGTERM, budget_s=grace_period)
            self.saves.ask(ask, time.monotonic())
            return True
        if unfit != "no rank reports checkpoints":  # a job that saves nothing loses nothing it could have kept
            self.saves.stopped_unsaved = True  # the report says what is lost, once the ranks have ended
            self.job.sink.notice(f"received {name}; no save before the stop: {unfit}{time_limit_hint()}")
        return False
