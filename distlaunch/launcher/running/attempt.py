"""One attempt of a job: start every agent, read their events, stop every rank on the first failure or a signal,
and hand each event to the watches (``supervising/``) that decide the rest. The attempt is the event loop; its
collaborators are the watches (``supervising/watches.py``), the failed ranks and their root cause
(``failures.py``) and the stops from outside its ranks (``interruptions.py``)."""

from __future__ import annotations

import queue
import threading
import time

from distlaunch import protocol as p
from distlaunch.launcher.planning.plan import NodePlan
from distlaunch.launcher.running.context import JobContext
from distlaunch.launcher.running.failures import Failures
from distlaunch.launcher.running.interruptions import Interruptions
from distlaunch.launcher.running.outcome import AttemptOutcome
from distlaunch.launcher.supervising.recovery import AttemptEnd, NextAttempt
from distlaunch.launcher.supervising.watch import Agents, Stop
from distlaunch.launcher.supervising.watches import AttemptWatches
from distlaunch.readable import plural

# Agents' events wait here for the supervision loop. Bounded: when rank output outruns the loop, the
# reader threads wait, the agents' pipes fill and the ranks are slowed, and the launcher's memory stays flat.
EVENT_QUEUE_SIZE = 256


class CannotStart(Exception):
    """Some host cannot start its ranks (a script missing there, say): found before any rank started anywhere.
    ``problems``: host -> what its agent found (distlaunch/startcheck.py), for the launcher to put in words."""

    def __init__(self, problems: dict[str, list[dict]]):
        super().__init__(problems)
        self.problems = problems


class Attempt:
    """One start of every rank of ``step``'s plan, the ``restart_count``-th restart of the job; ends when every
    agent has reported its ranks' exits. The loop starts the agents, hands their events to the watches and its
    collaborators, and stops every rank on the first failure, a watch's decision or a signal."""

    def __init__(self, job: JobContext, step: NextAttempt, restart_count: int):
        self.job, self.step, self.restart_count = job, step, restart_count
        self.plan = step.plan
        self.events: queue.Queue[tuple[int, dict]] = queue.Queue(EVENT_QUEUE_SIZE)
        self.agents = Agents(self.plan)
        # Wall clock, as agents stamp exits with theirs: failures are ordered by when they happened, not by
        # which host's report arrived first.
        self.started_at = time.time()
        self.stopped_at: float | None = None  # when every agent was told to stop (wall clock)
        self.unconfirmed: list[str] = []  # hosts whose ranks we could not confirm stopped
        self.stragglers = 0  # processes of this job that outlived their rank's process group, ended by agents
        self.quarantine: dict[str, str] = {}  # hosts a watch wants out of the job (host -> why)
        self.cpus: dict[int, str] = {}  # rank -> the CPUs its agent bound it to
        self.watches = AttemptWatches.build(
            self.plan, self.agents, restart_count, job.options, job.sink, job.logs, job.requests
        )
        self.failures = Failures(job, self.agents, self.watches.output, self.stop, self.started_at)
        self.interruptions = Interruptions(job, self.agents, self.watches.saves, self.stop)

    def payload(self, node: NodePlan) -> dict:
        """What the node's agent is started with."""
        x = self.job.options
        return {
            "node_rank": node.node_rank,
            "ranks": [r.model_dump() for r in node.ranks],
            "restart_count": self.restart_count,
            "grace_period": x.grace_period,
            "workdir": node.workdir or x.workdir,  # the plan's: absolute, as every host must read it
            "heartbeat_timeout": x.heartbeat_timeout,
            "hang_timeout": x.hang_timeout,
            "gate": self.watches.gate.gated,
            "cpu_bind": self.plan.cpu_bind,
            "preload": self.plan.preload,
        }

    def run(self) -> AttemptOutcome:
        """Start every agent and supervise its ranks to the end; how the attempt ended, failures root cause first."""
        try:
            for node in self.plan.nodes:
                conn = self.step.connect(node, self.events)
                self.agents.add(conn)
                conn.start(self.payload(node))
            self.loop()
            if self.watches.gate.problems:
                raise CannotStart(self.watches.gate.problems)
            self.failures.root_cause_first()
            for watch in self.watches.all:
                watch.finish()
        finally:
            ended_at = time.time()
            # Readers still posting (the loop ended early) must not block on the full queue while we close.
            threading.Thread(target=_discard, args=(self.events,), daemon=True).start()
            given_up = {s.host for s in self.watches.heartbeats.silent} | set(self.unconfirmed)
            for conn in self.agents.all:
                conn.close(wait_s=0.5 if conn.host in given_up else None)
            self.job.logs.close()
        return self.outcome(ended_at)

    def loop(self) -> None:
        """Handle the agents' events until every agent has reported; every turn, each watch may stop the job."""
        while self.agents.pending:
            self.interruptions.check()
            if self.interruptions.kill_overdue(time.monotonic()):
                self.unconfirmed = [c.host for c in self.agents.pending.values()]
                self.job.sink.notice(f"could not confirm that every rank stopped on {', '.join(self.unconfirmed)}")
                return
            now = time.monotonic()
            for watch in self.watches.all:
                decision = watch.tick(now)
                if decision is not None:
                    self.obey(decision)
            try:
                node_rank, event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            for watch in self.watches.all:
                watch.on_event(node_rank, event)
            self.handle(node_rank, event)

    def handle(self, node_rank: int, event: dict) -> None:
        """An agent's event about its ranks (exit, stragglers) or itself (its own output, done, lost)."""
        kind, host = event.get("ev"), self.agents.node_of[node_rank].host
        if kind == p.AGENT_OUT:
            self.job.sink.notice(f"{host}: {event['line']}")
        elif kind == p.STARTED and event.get("cpus"):
            self.cpus[event["rank"]] = event["cpus"]
        elif kind == p.EXIT:
            self.failures.on_exit(event, self.agents.by_node[node_rank])
        elif kind == p.STRAGGLERS:
            self.stragglers += event["count"]
            self.job.sink.notice(
                f"ended {plural(event['count'], 'stray process', 'stray processes')} of this job on {host}: {event['pids']}"
            )
        elif kind in (p.DONE, p.LOST) and node_rank in self.agents.pending:
            self.agents.done_with(node_rank)
            if kind == p.LOST:
                self.failures.on_lost(node_rank)

    def obey(self, decision: Stop) -> None:
        """A watch's stop; the ranks of the hosts it failed count as failures even if the job is stopping."""
        self.failures.on_hosts_failed(decision.failed)
        for host, why in decision.quarantine.items():
            self.quarantine.setdefault(host, why)
        self.stop(decision.reason)

    def stop(self, reason: str) -> None:
        """Fail fast: tell every agent to stop its ranks (once), saying why."""
        if self.agents.stopping:
            return
        self.agents.stopping = True
        self.stopped_at = time.time()
        self.job.sink.notice(f"{reason}; stopping all ranks (grace period {self.job.options.grace_period:g}s)")
        self.agents.send_all(p.command(p.STOP))

    def outcome(self, ended_at: float) -> AttemptOutcome:
        """How this attempt ended (at ``ended_at``), as the recovery policy and the job's report read it."""
        w = self.watches
        end = AttemptEnd(
            plan=self.plan,
            connect=self.step.connect,
            failures=self.failures.ranks,
            hang=w.hangs.report,
            silent=w.heartbeats.silent,
            quarantine=self.quarantine,
        )
        return AttemptOutcome(
            end=end,
            restart_count=self.restart_count,
            dropped=self.step.dropped,
            added=self.step.added,
            started_at=self.started_at,
            ended_at=ended_at,
            stopped_at=self.stopped_at,
            unconfirmed=self.unconfirmed,
            stragglers=self.stragglers,
            stragglers_found=w.straggling.found,
            steps=w.steps,
            saved=w.saves.saved,
            save_outcome=w.saves.outcome,
            stopped_unsaved=w.saves.stopped_unsaved,
            cpus=self.cpus,
        )


def _discard(events: queue.Queue) -> None:
    while True:
        events.get()
