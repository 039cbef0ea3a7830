"""What the supervision loop (running/attempt.py) shares with its collaborators: the attempt's agents as they
see them, the ``Watch`` interface they implement, and the ``Stop`` a watch may decide on.

A watch is told of every agent event and asked on every turn of the loop whether the job must stop; it never
stops the job itself. Heartbeats, the hang watch, stacks on request and flight-recorder dumps are watches; a
straggler watch or a spare-host policy plugs in the same way."""

from __future__ import annotations

from dataclasses import dataclass, field

from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.protocol import AgentConnection


class Agents:
    """One attempt's agents: every connection, those still expected to report, and the ranks that exited."""

    def __init__(self, plan: LaunchPlan):
        self.node_of = {n.node_rank: n for n in plan.nodes}  # a per-node launch holds one node, not node 0
        self.host_of = {r.rank: n.host for n in plan.nodes for r in n.ranks}
        self.all: list[AgentConnection] = []
        self.pending: dict[int, AgentConnection] = {}  # node rank -> its agent, until it reported or was given up
        self.by_node: dict[int, AgentConnection] = {}
        self.exited: set[int] = set()
        self.stopping = False  # every agent was told to stop its ranks (or none started)

    def add(self, conn: AgentConnection) -> None:
        """A connection, about to start its agent."""
        self.all.append(conn)
        self.pending[conn.node_rank] = self.by_node[conn.node_rank] = conn

    def done_with(self, node_rank: int) -> None:
        """Expect nothing more from this node's agent (it reported its last event, was lost, or given up)."""
        self.pending.pop(node_rank, None)

    def send_all(self, message: dict) -> None:
        """Send a command to every agent, even one that has reported its end."""
        for conn in self.all:
            conn.send(message)

    def ask_pending(self, message: dict) -> None:
        """Send a command to every agent still expected to report."""
        for conn in self.pending.values():
            conn.send(message)

    def running(self, node_rank: int) -> list[int]:
        """The node's ranks that have not exited."""
        return [r.rank for r in self.node_of[node_rank].ranks if r.rank not in self.exited]

    def waiting_ranks(self) -> set[int]:
        """Ranks still running under an agent that still answers: those whose stacks can come."""
        return {rank for node_rank in self.pending for rank in self.running(node_rank)}


@dataclass
class HostFailure:
    """Every rank still running on a node counts as failed with ``exit_code``, ``note`` ending its tail."""

    node_rank: int
    exit_code: int
    note: str
    at: float  # wall clock


@dataclass
class Stop:
    """A watch's decision: stop every rank, saying ``reason`` (ignored when the job is stopping already)."""

    reason: str
    failed: list[HostFailure] = field(default_factory=list)  # recorded even when the job is stopping already
    # hosts the next attempt must not use (host -> why, in a few words): a spare takes each one's place, or the job
    # shrinks (launcher/elastic/healing.py); only in a job with spares (--nnodes MIN:MAX), else the job just stops
    quarantine: dict[str, str] = field(default_factory=dict)


class Watch:
    """A collaborator of the supervision loop. Every method may be left as it is: a watch does nothing unasked."""

    def on_event(self, node_rank: int, event: dict) -> None:
        """An event from the agent of ``node_rank``, before the loop handles it."""

    def tick(self, now: float) -> Stop | None:
        """One turn of the loop (``now``: time.monotonic()): a Stop to end the job, or None."""
        return None

    def finish(self) -> None:
        """The attempt ended normally (every agent reported or was given up): say what is left to say."""
