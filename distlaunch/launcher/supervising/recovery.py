"""Between attempts: what a recovery policy reads of an attempt's end, and what it starts next. ``Restarts`` (the
same plan again, up to --max-restarts times) is the rule without spares; ``elastic.healing.Healing`` is the rule
of a job with spares (--nnodes MIN:MAX)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from distlaunch.contract.report import HangReport, RankExit, SilentHost
from distlaunch.launcher.planning.plan import LaunchPlan, NodePlan
from distlaunch.protocol import AgentConnection

Connect = Callable[[NodePlan, "queue.Queue[tuple[int, dict]]"], AgentConnection]


@dataclass
class AttemptEnd:
    """How an attempt ended, as a recovery policy reads it: its plan and how it reached its hosts, its failures
    (root cause first), its hang, its hosts gone silent, and the hosts a watch wants out (host -> why)."""

    plan: LaunchPlan
    connect: Connect
    failures: list[RankExit]
    hang: HangReport | None
    silent: list[SilentHost]
    quarantine: dict[str, str]


@dataclass
class NextAttempt:
    """What a recovery policy starts next: a plan (maybe on other hosts, maybe smaller), how to reach its hosts,
    and what changed."""

    plan: LaunchPlan
    connect: Connect
    dropped: dict[str, str] = field(default_factory=dict)  # host -> why it left the job
    added: list[str] = field(default_factory=list)  # spares that joined


class Recovery(Protocol):
    """What follows an attempt that did not finish: the next attempt, or None to end the job there."""

    def after(self, end: AttemptEnd, restart_count: int) -> NextAttempt | None: ...


@dataclass
class Restarts:
    """The rule without spares: the same plan again, up to --max-restarts times, after a failure or a hang."""

    max_restarts: int
    notice: Callable[[str], None]

    def after(self, end: AttemptEnd, restart_count: int) -> NextAttempt | None:
        if restart_count >= self.max_restarts or not (end.failures or end.hang):
            return None
        count = f"{restart_count + 1}/{self.max_restarts}"
        cause = "the hang" if end.hang is not None else end.failures[0].what
        self.notice(f"restarting the job ({count}) after {cause}")
        return NextAttempt(end.plan, end.connect)
