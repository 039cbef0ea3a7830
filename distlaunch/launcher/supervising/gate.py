"""The start gate: a job on several hosts starts no rank until every host's agent has checked that its own can."""

from __future__ import annotations

from distlaunch import protocol as p
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.watch import Agents, Watch


class StartGate(Watch):
    """A job on several hosts is gated: no rank starts until every agent has checked that its own can. Once every
    one has: go, or (a host cannot start its ranks) send every agent away without a rank started anywhere."""

    def __init__(self, plan: LaunchPlan, agents: Agents):
        self.agents = agents
        self.gated = any(not node.local for node in plan.nodes)
        self.unready = {n.node_rank for n in plan.nodes} if self.gated else set()
        self.problems: dict[str, list[dict]] = {}  # host -> what keeps its ranks from starting

    def on_event(self, node_rank: int, event: dict) -> None:
        """A gated agent has checked its host."""
        if event.get("ev") != p.READY:
            return
        self.unready.discard(node_rank)
        if event.get("problems"):
            self.problems[self.agents.node_of[node_rank].host] = event["problems"]
        if self.unready or self.agents.stopping:
            return
        if self.problems:
            self.agents.stopping = True  # no rank started: nothing to stop, nothing to report as stopped
        self.agents.send_all(p.command(p.STOP if self.problems else p.GO))
