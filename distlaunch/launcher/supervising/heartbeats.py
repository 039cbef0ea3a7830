"""--heartbeat-timeout: the launcher pings every agent, and gives up a host whose agent has said nothing for the
timeout (exit 3, like a host that cannot be reached). Every message of an agent counts as its heartbeat: the
connection notes when it last heard one (``AgentConnection.last_seen``)."""

from __future__ import annotations

import time

from distlaunch import protocol as p
from distlaunch.contract.report import HOST_SILENT_CODE, SilentHost
from distlaunch.launcher.supervising.watch import Agents, HostFailure, Stop, Watch


class HeartbeatWatch(Watch):
    """Pings the agents every third of the timeout; says which hosts went silent (``silent``) and stops the job."""

    def __init__(self, agents: Agents, timeout: float):
        self.agents, self.timeout = agents, timeout  # 0: never give up a host
        self.silent: list[SilentHost] = []
        self.turn_at: float | None = None  # the loop's previous turn
        self.ping_at = 0.0  # the first turn pings at once

    def tick(self, now: float) -> Stop | None:
        """Forgive a silence that was this launcher's own; every third of the timeout, ping and judge the agents."""
        if not self.timeout:
            return None
        if self.turn_at is not None and now - self.turn_at > self.timeout / 2:
            # This launcher was frozen (SIGSTOP, a suspended machine): the agents' silence was ours, and what
            # they sent meanwhile is still queued. Judge them on a fresh window, after reading it.
            for conn in self.agents.pending.values():
                conn.last_seen = max(conn.last_seen, now)
        self.turn_at = now
        if now < self.ping_at:
            return None
        self.ping_at = now + self.timeout / 3
        return self.judge(now)

    def judge(self, now: float) -> Stop | None:
        """Send every agent our heartbeat; give up the hosts whose agents have been silent for the timeout."""
        now_wall = time.time()
        stop = None
        for conn in list(self.agents.pending.values()):
            conn.send(p.command(p.PING))
            silent_s = now - conn.last_seen
            if silent_s <= self.timeout:
                continue
            self.agents.done_with(conn.node_rank)  # nothing more can be expected from it
            self.silent.append(SilentHost(host=conn.host, silent_s=round(silent_s, 1)))
            host = self.agents.node_of[conn.node_rank].host
            stop = stop or Stop(
                f"{conn.host} has been silent for {silent_s:.1f}s (no message from its agent; "
                f"--heartbeat-timeout {self.timeout:g})"
            )
            stop.failed.append(
                HostFailure(conn.node_rank, HOST_SILENT_CODE, f"distlaunch: {host} went silent", now_wall)
            )
        return stop
