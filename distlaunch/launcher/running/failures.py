"""One attempt's failed ranks, root cause first. Ranks fail by their own exit, by their agent stopping them
unasked, by their agent vanishing, or by what a watch saw of their host; the first failure on its own stops
the job, and a failure found late that came first is named the root cause."""

from __future__ import annotations

import time
from collections.abc import Callable

from distlaunch.contract.report import HOST_SILENT_CODE, LOST_AGENT_CODE, RankExit, exit_code_of
from distlaunch.launcher.running.context import JobContext
from distlaunch.launcher.supervising.output import RankOutput
from distlaunch.launcher.supervising.watch import Agents, HostFailure
from distlaunch.protocol import AgentConnection


class Failures:
    """The failed ranks of one attempt (``ranks``), each with its tail, its exit code and when it failed.
    ``stop`` stops every rank of the attempt, saying why."""

    def __init__(
        self, job: JobContext, agents: Agents, output: RankOutput, stop: Callable[[str], None], started_at: float
    ):
        self.job, self.agents, self.output, self.stop, self.started_at = job, agents, output, stop, started_at
        self.ranks: list[RankExit] = []

    def since_start(self, at: float) -> float:
        """Seconds from the attempt's start to ``at`` (wall clock)."""
        return round(at - self.started_at, 3)

    def root_cause_first(self) -> list[RankExit]:
        """The failures ordered by when they happened (stable: ties keep arrival order)."""
        self.ranks.sort(key=lambda f: f.time_s)
        return self.ranks

    def on_exit(self, event: dict, conn: AgentConnection) -> None:
        """A rank ended. A failure on its own (before its agent was told to stop) is kept even while stopping:
        a crash makes its peers fail milliseconds later, and their host's report may arrive first."""
        rank = event["rank"]
        self.agents.exited.add(rank)
        # on our clock: hosts' clocks may disagree by seconds, and the root cause is the earliest failure
        at = event["at"] - conn.clock_offset if event.get("at") else time.time()
        stopping = self.agents.stopping
        if event.get("stopped") and not stopping:
            self.on_stopped_by_agent(rank, at)
            return
        if event["code"] == 0 or event.get("stopped", stopping):
            return
        code, signame = exit_code_of(event["code"])
        failure = RankExit(
            rank=rank,
            host=self.agents.host_of[rank],
            exit_code=code,
            signal=signame,
            tail=self.output.tail(rank),
            error=event.get("error"),
            time_s=self.since_start(at),
            at=at,
        )
        first = min(self.ranks, key=lambda f: f.time_s, default=None)
        self.ranks.append(failure)
        if not stopping:
            self.stop(failure.what)
        else:
            self.say_if_first(failure, first)

    def say_if_first(self, failure: RankExit, first: RankExit | None) -> None:
        """A failure that came while the job was stopping: name it the root cause when it happened first."""
        notice, signalled_at = self.job.sink.notice, self.job.interrupts.first_at
        if first is not None and failure.time_s < first.time_s:
            earlier = f"{first.time_s - failure.time_s:.3f}s before rank {first.rank} did"
            notice(f"{failure.what}, {earlier}: it failed first (the root cause)")
        elif first is None and (signalled_at is None or failure.at <= signalled_at):
            # the job is stopping for a signal (or a hang) that came after this failure
            notice(f"{failure.what}, before the stop: it failed first (the root cause)")

    def on_stopped_by_agent(self, rank: int, at: float) -> None:
        """A rank its agent stopped though this launcher never asked: the agent heard nothing from us for the
        heartbeat timeout (this machine frozen or suspended, the link cut) or was signalled itself. Whatever
        the rank's code, the job did not finish: a failure of that host (exit 3), never a success."""
        self.fail(rank, HOST_SILENT_CODE, "distlaunch: stopped by its agent, not by the launcher", at)
        self.stop(
            f"the agent on {self.agents.host_of[rank]} stopped its ranks on its own: it heard nothing from this launcher for "
            f"--heartbeat-timeout {self.job.options.heartbeat_timeout:g}s (was this machine frozen or suspended?), "
            "or it was signalled"
        )

    def on_lost(self, node_rank: int) -> None:
        """An agent vanished without reporting its ranks: they failed (exit 255), unless the job was stopping."""
        lost = self.agents.running(node_rank)
        if not lost or self.agents.stopping:
            return
        now = time.time()
        for rank in lost:
            self.fail(rank, LOST_AGENT_CODE, "distlaunch: lost contact with this node's agent", now)
        self.stop(f"lost contact with the agent on {self.agents.node_of[node_rank].host}")

    def on_hosts_failed(self, failed: list[HostFailure]) -> None:
        """A watch failed these hosts: their ranks still running count as failures even if the job is stopping."""
        for host in failed:
            for rank in self.agents.running(host.node_rank):
                self.fail(rank, host.exit_code, host.note, host.at)

    def fail(self, rank: int, exit_code: int, note: str, at: float) -> None:
        """A rank ended by what distlaunch saw of its host, not by its own exit: ``note`` ends its tail."""
        tail, host = [*self.output.tail(rank), note], self.agents.host_of[rank]
        failure = RankExit(rank=rank, host=host, exit_code=exit_code, tail=tail, time_s=self.since_start(at), at=at)
        self.ranks.append(failure)
