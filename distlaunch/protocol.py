"""The launcher ⇄ agent protocol, for both sides and every transport (a child process here, an OpenSSH client's
pipes, a paramiko channel).

One JSON object per line. The launcher writes the node plan as the first line of the agent's stdin, then
commands (``{"cmd": ...}``); the agent writes events (``{"ev": ...}``) on its stdout:

    {"ev": "hello", "python": "3.11.7", "protocol": 4,        at once, before the node plan is read; now: the
     "now": 1795552340.02, "inventory": {...}}                 agent's wall clock (see clock_offset); inventory:
                                                               the host's GPUs, CPUs, NUMA nodes, interfaces and
                                                               InfiniBand (distlaunch/hostprobe.py)
    {"ev": "ready", "problems": [...], "plan_at": 1795552340.3} a plan with "gate": true: what keeps its ranks
                                                               from starting here (distlaunch/startcheck.py),
                                                               checked before any; then "go", or "stop";
                                                               plan_at: the agent's wall clock when the plan
                                                               came (AgentConnection.narrow_clock)
    {"ev": "started", "rank": 3, "pid": 1234, "cpus": "0-3",   cpus: the CPUs the rank may run on (the kernel's CPU
     "warm": true}                                             list syntax), as the plan's cpu_bind placed it;
                                                               warm: forked from the host's preloaded process
                                                               (the plan's "preload", agent/warm.py)
    {"ev": "out", "rank": 3, "fd": 1, "line": "loss 2.31"}     a line, a \\r-redraw, or a piece of a long line
    {"ev": "progress", "ranks": {"3": {"step": 120,            ranks called distlaunch.progress() (at most one
     "compute_s": 0.21, "n": 50, "saved_step": 100,            event a second, but at once for a new saved_step);
     "save_s": 1.2, "answered": 2, "answered_step": 100,       ranks: each one's report as it wrote it, by global
     "at": 1795552340.5}}}                                     rank (step, median seconds outside collectives
                                                               over its last n steps, newest checkpoint step,
                                                               how long that save took, the newest save request
                                                               it answered and the step of that answer, its wall
                                                               clock; any may be null); a rank whose report
                                                               could not be read is left out, its call still
                                                               counts as progress
    {"ev": "stacks", "rank": 3, "tool": "faulthandler", "text": "..."}
    {"ev": "exit", "rank": 3, "code": 1, "at": 1795552341.157,  negative code: killed by that signal; at: the
     "stopped": false, "error": {...}}                         agent's wall clock when it saw the exit; stopped:
                                                               it came after a stop or kill (else: on its own)
    {"ev": "stragglers", "count": 2, "pids": [..]}             processes of the job left after its ranks ended
    {"ev": "nccl-trace", "rank": 3, "name": "nccl_trace_rank_3", "size": 81920, "offset": 0,
     "data": "<base64>", "last": false}                        a piece of a rank's NCCL flight recorder dump,
                                                               sent once its ranks are gone: pieces of at most
                                                               NCCL_TRACE_CHUNK_BYTES, in order, the whole
                                                               holding at most NCCL_TRACE_MAX_BYTES of size
    {"ev": "hb"}                                               heartbeat
    {"ev": "done"}                                             the agent is finished; nothing follows

Commands: ``go`` (start the ranks of a gated plan), ``stop`` (SIGTERM, the grace period, SIGKILL), ``kill``,
``stacks``, ``hb``, ``save`` (``{"cmd": "save", "id": 2, "then": "stop", "why": "SIGUSR1"}``: written to every
rank's request file, which ``distlaunch.checkpoint_requested()`` reads) and ``signal`` (``{"cmd": "signal", "sig":
"USR2"}``: sent to every rank's own process, ``--forward-signals``). The launcher's side
of a connection adds two events of its own: ``agent-out`` (a line that is not ours: a login banner, an
interpreter's crash) and ``lost`` (the output ended without ``done``).

Standard library only: the agent imports it on every host.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator

# The protocol's version, in every agent's hello. A launcher and an agent of another distlaunch may not
# understand each other (an agent from before the gate starts its ranks at once, unchecked), so a remote
# host whose agent speaks another version is refused before any rank starts. Raise it whenever a message
# is added or changes meaning. 1: hellos without it (before the gate); 2: before save and signal; 3: hellos
# without the host's inventory.
PROTOCOL = 4
# events, agent → launcher
HELLO, READY, STARTED, OUT, PROGRESS, STACKS, EXIT, STRAGGLERS, NCCL_TRACE, HEARTBEAT, DONE = (
    "hello", "ready", "started", "out", "progress", "stacks", "exit", "stragglers", "nccl-trace", "hb", "done"
)  # fmt: skip
_HEARTBEAT_LINES = frozenset(
    {json.dumps({"ev": HEARTBEAT}), json.dumps({"ev": HEARTBEAT}) + "\n"}
)  # as agents write it
# events the launcher's side of a connection makes itself
AGENT_OUT, LOST = "agent-out", "lost"
# commands, launcher → agent
GO, STOP, KILL, ASK_STACKS, PING, SAVE, SIGNAL = "go", "stop", "kill", "stacks", "hb", "save", "signal"

# NCCL flight recorder dumps (written by PyTorch as <prefix><global rank>, a pickle): the agent points the
# ranks' TORCH_FR_DUMP_TEMP_FILE at <its scratch folder>/NCCL_TRACE_PREFIX and sends what is there at the end.
# The launcher stores the bytes as they came (never unpickles them) under the same name.
NCCL_TRACE_PREFIX = "nccl_trace_rank_"
NCCL_TRACE_MAX_BYTES = 4 << 20  # per rank: a longer dump is cut
# per event: what one event costs the agent and the launcher, whatever the dump's size and the ranks' count
NCCL_TRACE_CHUNK_BYTES = 48 << 10

GRACE_PERIOD_S = 10.0  # SIGTERM to SIGKILL, unless --grace-period says otherwise

# The oldest Python the agent and rankboot run on: they run on every host, under whatever interpreter it has
# (--remote-python, --python). The one statement of it; pyproject.toml's requires-python says the same (a
# test holds the two together). An older one is refused in one line (python_refusal) before anything runs.
PYTHON_FLOOR = (3, 10)
NEEDS_FLOOR = f"needs Python {'.'.join(map(str, PYTHON_FLOOR))} or newer"  # in each refusal: how a launcher knows one


def python_refusal(
    program: str, version: tuple = tuple(sys.version_info), executable: str = sys.executable
) -> str | None:
    """The one line that refuses an interpreter older than PYTHON_FLOOR to ``program``; None for one new enough.
    This file must still load on an older Python, to say so: nothing in it may need the floor to parse."""
    if tuple(version[:2]) >= PYTHON_FLOOR:
        return None
    return f"distlaunch's {program} {NEEDS_FLOOR}; {executable} is Python {'.'.join(map(str, version[:3]))}"


def clock_offset(agent_now: object, sent: float, heard: float) -> float:
    """How far an agent's wall clock is ahead of ours (negative: behind), as far as it is sure.

    The agent read its clock (``agent_now``) for its hello between our start of it (``sent``) and our
    reading of the hello (``heard``), both on our clock. So the offset lies in [agent_now - heard,
    agent_now - sent]; this returns the point of that interval nearest 0: 0 for clocks that agree within the
    start-up time, else never more than the true offset. Subtracting it from the agent's times (a rank's
    exit) can only bring them nearer ours: a root cause is never misordered by the correction itself."""
    return nearest_zero(*clock_bounds(agent_now, sent, heard))


def clock_bounds(agent_at: object, sent: float, heard: float) -> tuple[float, float]:
    """Where an agent's clock offset lies, from one reading of its clock (``agent_at``) that it took between
    ``sent`` and ``heard`` on ours (see clock_offset); anywhere, for an agent that does not say."""
    if not isinstance(agent_at, int | float) or isinstance(agent_at, bool):
        return -math.inf, math.inf
    return agent_at - heard, agent_at - sent


def nearest_zero(low: float, high: float) -> float:
    """The offset of [low, high] that corrects least: 0 when the interval holds it."""
    return low if low > 0 else high if high < 0 else 0.0


def event(kind: str, **fields) -> dict:
    return {"ev": kind, **fields}


def command(kind: str, **fields) -> dict:
    return {"cmd": kind, **fields}


def encode(message: dict) -> str:
    return json.dumps(message) + "\n"


class AgentConnection(ABC):
    """The launcher's end of one agent: its events are posted to ``events`` as (node_rank, event)."""

    def __init__(self, node_rank: int, host: str, events: queue.Queue[tuple[int, dict]]):
        self.node_rank = node_rank
        self.host = host
        self.events = events
        self.last_seen = time.monotonic()  # when the agent last said anything (its heartbeat included)
        self.done = False  # the agent said "done": its output may end now
        self.clock_offset = 0.0  # the agent's wall clock minus ours (clock_offset): its exit times are read by it
        self.clock_bounds = (-math.inf, math.inf)  # where that offset lies, as far as the agent's messages tell
        self.plan_sent: float | None = None  # our wall clock just before the node plan went out

    @abstractmethod
    def start(self, payload: dict) -> None:
        """Start the agent and send it its node plan."""

    @abstractmethod
    def send(self, message: dict) -> None:
        """Send a command line to the agent."""

    @abstractmethod
    def close(self, wait_s: float | None = None) -> None:
        """Close the connection and wait for the agent (at most ``wait_s``, then leave it)."""

    def pump(self, lines: Iterator[str]) -> None:
        """Read agent output until it ends; a missing ``done`` means the agent died."""
        for line in lines:
            self.take(line)
        self.ended()

    def take(self, line: str) -> None:
        """One line of the agent's output, as its reader got it: an event for the launcher (heartbeats only
        count as signs of life), or ``agent-out`` for a line that is not ours."""
        self.last_seen = time.monotonic()
        if line in _HEARTBEAT_LINES:  # most of what an idle job's agents say: a sign of life, nothing to parse
            return
        try:
            message = json.loads(line)
        except ValueError:  # not ours: a remote login banner or an interpreter crash
            message = event(AGENT_OUT, line=line.rstrip("\n"))
        if not isinstance(message, dict):
            message = event(AGENT_OUT, line=line.rstrip("\n"))
        kind = message.get("ev")
        self.done = self.done or kind == DONE
        if kind == READY and self.plan_sent is not None:
            self.narrow_clock(message.get("plan_at"), self.plan_sent, time.time())
        if kind != HEARTBEAT:
            self.events.put((self.node_rank, message))

    def narrow_clock(self, agent_at: object, sent: float, heard: float) -> None:
        """One more reading of the agent's clock (``agent_at``, taken between ``sent`` and ``heard`` on ours)
        narrows where its offset lies. Its plan's arrival, read back in ``ready``, is one round trip from ours;
        the hello, read after a login and an interpreter's start, may be a second or more: together they place
        the offset within about a round trip, as neither alone does."""
        low, high = clock_bounds(agent_at, sent, heard)
        low, high = max(low, self.clock_bounds[0]), min(high, self.clock_bounds[1])
        if low <= high:  # else a clock was stepped meanwhile: keep what was known
            self.clock_bounds = (low, high)
            self.clock_offset = nearest_zero(low, high)

    def ended(self) -> None:
        """The agent's output ended: without a ``done`` first, the agent died (``lost``)."""
        if not self.done:
            self.events.put((self.node_rank, event(LOST)))
