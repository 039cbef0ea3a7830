"""Every rank's output, as agents forward it: streamed to the sink and the rank logs, its last lines kept for the
rank's failure report."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from distlaunch import protocol as p
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.ranklogs import RankLogs
from distlaunch.launcher.supervising.watch import Watch

if TYPE_CHECKING:
    from distlaunch.contract.sink import Sink

TAIL_LINES = 10


class RankOutput(Watch):
    """Shows each rank's lines (``shown``: only these local ranks', None: all), logs them all, keeps their tails."""

    def __init__(self, plan: LaunchPlan, sink: Sink, logs: RankLogs, shown: list[int] | None):
        self.sink, self.logs, self.shown = sink, logs, shown
        self.placed = {r.rank: (n, r) for n in plan.nodes for r in n.ranks}  # rank -> its node and its plan
        self.tails = {r: collections.deque(maxlen=TAIL_LINES) for r in self.placed}

    def on_event(self, node_rank: int, event: dict) -> None:
        """A rank started, or wrote a line."""
        kind = event.get("ev")
        if kind == p.STARTED:
            self.logs.started(event["rank"], *self.placed[event["rank"]])
        elif kind == p.OUT:
            self.line(event["rank"], event["fd"], event["line"])

    def line(self, rank: int, fd: int, line: str) -> None:
        """A line the rank wrote to ``fd``."""
        self.tails[rank].append(line)
        node, spec = self.placed[rank]
        if self.shown is None or spec.local_rank in self.shown:
            self.sink.rank_line(node.host, rank, fd, line)
        self.logs.line(rank, fd, line, node, spec)

    def tail(self, rank: int) -> list[str]:
        """The rank's last lines."""
        return list(self.tails[rank])
