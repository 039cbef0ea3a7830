"""One attempt of a job: start every agent, read their events, stop every rank on the first failure or a signal,
and hand each event to the watches (``supervising/``) that decide the rest."""

from __future__ import annotations

import queue
import signal
import threading
import time

from distlaunch import protocol as p
from distlaunch.contract.options import ExecOptions
from distlaunch.contract.report import HOST_SILENT_CODE, LOST_AGENT_CODE, RankExit, exit_code_of
from distlaunch.contract.sink import Sink
from distlaunch.launcher.planning.plan import LaunchPlan, NodePlan
from distlaunch.launcher.running.signals import SignalTrap
from distlaunch.launcher.supervising.dumps import AttemptFolder, FlightRecorderDumps
from distlaunch.launcher.supervising.gate import StartGate
from distlaunch.launcher.supervising.goodput import StepTimeline
from distlaunch.launcher.supervising.hangwatch import HangWatch, StacksOnRequest, report_after
from distlaunch.launcher.supervising.heartbeats import HeartbeatWatch
from distlaunch.launcher.supervising.liveview import LiveView
from distlaunch.launcher.supervising.output import RankOutput
from distlaunch.launcher.supervising.ranklogs import RankLogs
from distlaunch.launcher.supervising.recovery import AttemptEnd, Connect
from distlaunch.launcher.supervising.requests import ForwardSignals, JobRequests, SaveAsk, StopRequest
from distlaunch.launcher.supervising.saves import SaveWatch, time_limit_hint
from distlaunch.launcher.supervising.stragglers import StragglerWatch
from distlaunch.launcher.supervising.watch import Agents, Stop, Watch
from distlaunch.protocol import AgentConnection
from distlaunch.readable import plural

# Agents' events wait here for the supervision loop. Bounded: when rank output outruns the loop, the
# reader threads wait, the agents' pipes fill and the ranks are slowed, and the launcher's memory stays flat.
EVENT_QUEUE_SIZE = 256
KILL_CONFIRM_S = 1.5  # after a second interrupt: how long agents get to confirm before we leave


class CannotStart(Exception):
    """Some host cannot start its ranks (a script missing there, say): found before any rank started anywhere.
    ``problems``: host -> what its agent found (distlaunch/startcheck.py), for the launcher to put in words."""

    def __init__(self, problems: dict[str, list[dict]]):
        super().__init__(problems)
        self.problems = problems


class Attempt:
    """One start of every rank; ends when every agent has reported its ranks' exits. The core of supervision:
    start the agents, handle their ranks' output and exits, stop every rank on the first failure or a signal.
    Everything else watches alongside (``watches``): heartbeats, the hang watch, stacks, flight recorder dumps."""

    def __init__(
        self,
        plan: LaunchPlan,
        options: ExecOptions,
        sink: Sink,
        connect: Connect,
        restart_count: int,
        interrupts: SignalTrap,
        logs: RankLogs,
        requests: JobRequests | None = None,
        stop_request: StopRequest | None = None,
    ):
        self.plan, self.options, self.sink, self.connect, self.logs = plan, options, sink, connect, logs
        self.restart_count, self.interrupts, self.stop_request = restart_count, interrupts, stop_request
        self.events: queue.Queue[tuple[int, dict]] = queue.Queue(EVENT_QUEUE_SIZE)
        self.agents = Agents(plan)
        self.failures: list[RankExit] = []
        self.interrupt_seen = False
        self.saving_for_signal = False  # a SIGTERM came and the save it asked for is under way
        # Wall clock, as agents stamp exits with theirs: failures are ordered by when they happened, not by
        # which host's report arrived first.
        self.started_at = time.time()
        self.unconfirmed: list[str] = []  # hosts whose ranks we could not confirm stopped
        self.kill_deadline: float | None = None  # set by a second interrupt, when every agent is told to kill
        self.stragglers = 0  # processes of this job that outlived their rank's process group, ended by agents
        self.stopped_at: float | None = None  # when every agent was told to stop (wall clock)
        self.ended_at = self.started_at
        self.quarantine: dict[str, str] = {}  # hosts a watch wants out of the job (host -> why)
        self.steps = StepTimeline()
        self.dropped: dict[str, str] = {}  # what changed since the attempt before (NextAttempt)
        self.added: list[str] = []
        folder = AttemptFolder(plan, options.log_dir, restart_count)
        self.gate = StartGate(plan, self.agents)
        self.output = RankOutput(plan, sink, logs, options.local_ranks_filter)
        self.heartbeats = HeartbeatWatch(self.agents, options.heartbeat_timeout)
        self.hangs = HangWatch(self.agents, options.hang_timeout, folder, sink.notice)
        stalls_after = report_after(options.hang_report, options.hang_timeout)
        self.stalls = HangWatch(self.agents, stalls_after, folder, sink.notice, stops=False)
        asked = StacksOnRequest(self.agents, requests, plan.job_id, sink.notice)
        dumps = FlightRecorderDumps(folder, sink.notice)
        job_folder = requests.folder if requests is not None else None
        self.straggling = StragglerWatch(
            self.agents, options.on_straggler, sink.notice, restart_count, job_folder, plan.groups.get("pp")
        )
        self.saves = SaveWatch(self.agents, requests, self.steps, sink.notice, options.grace_period)
        # Told of every event and asked on every turn, in this order: a new watch is one more entry.
        self.watches: list[Watch] = [
            self.gate,
            self.output,
            self.heartbeats,
            self.hangs,
            self.stalls,
            asked,
            dumps,
            self.steps,
            self.straggling,
            self.saves,
            ForwardSignals(self.agents, requests),
            LiveView(plan, sink.status),
        ]

    def end(self) -> AttemptEnd:
        """How this attempt ended, as a recovery policy reads it."""
        return AttemptEnd(
            plan=self.plan,
            connect=self.connect,
            failures=self.failures,
            hang=self.hangs.report,
            silent=self.heartbeats.silent,
            quarantine=self.quarantine,
        )

    def payload(self, node: NodePlan) -> dict:
        """What the node's agent is started with."""
        return {
            "node_rank": node.node_rank,
            "ranks": [r.model_dump() for r in node.ranks],
            "restart_count": self.restart_count,
            "grace_period": self.options.grace_period,
            "workdir": node.workdir or self.options.workdir,  # the plan's: absolute, as every host must read it
            "heartbeat_timeout": self.options.heartbeat_timeout,
            "hang_timeout": self.options.hang_timeout,
            "gate": self.gate.gated,
        }

    def run(self) -> list[RankExit]:
        """Start every agent and supervise its ranks to the end; the failures, root cause first."""
        try:
            for node in self.plan.nodes:
                conn = self.connect(node, self.events)
                self.agents.add(conn)
                conn.start(self.payload(node))
            self.loop()
            if self.gate.problems:
                raise CannotStart(self.gate.problems)
            self.failures.sort(key=lambda f: f.time_s)  # root cause first (stable: ties keep arrival order)
            for watch in self.watches:
                watch.finish()
        finally:
            self.ended_at = time.time()
            # Readers still posting (the loop ended early) must not block on the full queue while we close.
            threading.Thread(target=_discard, args=(self.events,), daemon=True).start()
            given_up = {s.host for s in self.heartbeats.silent} | set(self.unconfirmed)
            for conn in self.agents.all:
                conn.close(wait_s=0.5 if conn.host in given_up else None)
            self.logs.close()
        return self.failures

    def loop(self) -> None:
        """Handle the agents' events until every agent has reported; every turn, each watch may stop the job."""
        while self.agents.pending:
            self.check_interrupts()
            if self.kill_deadline is not None and time.monotonic() > self.kill_deadline:
                self.unconfirmed = [c.host for c in self.agents.pending.values()]
                self.sink.notice(f"could not confirm that every rank stopped on {', '.join(self.unconfirmed)}")
                return
            now = time.monotonic()
            for watch in self.watches:
                decision = watch.tick(now)
                if decision is not None:
                    self.obey(decision)
            try:
                node_rank, event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            for watch in self.watches:
                watch.on_event(node_rank, event)
            self.handle(node_rank, event)

    def handle(self, node_rank: int, event: dict) -> None:
        """An agent's event about its ranks (exit, stragglers) or itself (its own output, done, lost)."""
        kind, host = event.get("ev"), self.agents.node_of[node_rank].host
        if kind == p.AGENT_OUT:
            self.sink.notice(f"{host}: {event['line']}")
        elif kind == p.EXIT:
            self.on_exit(event, self.agents.by_node[node_rank])
        elif kind == p.STRAGGLERS:
            self.stragglers += event["count"]
            self.sink.notice(
                f"ended {plural(event['count'], 'stray process', 'stray processes')} of this job on {host}: {event['pids']}"
            )
        elif kind in (p.DONE, p.LOST) and node_rank in self.agents.pending:
            self.agents.done_with(node_rank)
            if kind == p.LOST:
                self.on_lost(node_rank)

    def obey(self, decision: Stop) -> None:
        """A watch's stop; the ranks of the hosts it failed count as failures even if the job is stopping."""
        for failed in decision.failed:
            for rank in self.agents.running(failed.node_rank):
                self.fail(rank, failed.exit_code, failed.note, failed.at)
        for host, why in decision.quarantine.items():
            self.quarantine.setdefault(host, why)
        self.stop(decision.reason)

    def since_start(self, at: float) -> float:
        """Seconds from this attempt's start to ``at`` (wall clock)."""
        return round(at - self.started_at, 3)

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
        first = min(self.failures, key=lambda f: f.time_s, default=None)
        self.failures.append(failure)
        if not stopping:
            self.stop(failure.what)
        elif first is not None and failure.time_s < first.time_s:
            earlier = f"{first.time_s - failure.time_s:.3f}s before rank {first.rank} did"
            self.sink.notice(f"{failure.what}, {earlier}: it failed first (the root cause)")
        elif first is None and (self.interrupts.first_at is None or at <= self.interrupts.first_at):
            # the job is stopping for a signal (or a hang) that came after this failure
            self.sink.notice(f"{failure.what}, before the stop: it failed first (the root cause)")

    def on_stopped_by_agent(self, rank: int, at: float) -> None:
        """A rank its agent stopped though this launcher never asked: the agent heard nothing from us for the
        heartbeat timeout (this machine frozen or suspended, the link cut) or was signalled itself. Whatever
        the rank's code, the job did not finish: a failure of that host (exit 3), never a success."""
        self.fail(rank, HOST_SILENT_CODE, "distlaunch: stopped by its agent, not by the launcher", at)
        self.stop(
            f"the agent on {self.agents.host_of[rank]} stopped its ranks on its own: it heard nothing from this launcher for "
            f"--heartbeat-timeout {self.options.heartbeat_timeout:g}s (was this machine frozen or suspended?), "
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

    def fail(self, rank: int, exit_code: int, note: str, at: float) -> None:
        """A rank ended by what distlaunch saw of its host, not by its own exit: ``note`` ends its tail."""
        tail, host = [*self.output.tail(rank), note], self.agents.host_of[rank]
        failure = RankExit(rank=rank, host=host, exit_code=exit_code, tail=tail, time_s=self.since_start(at), at=at)
        self.failures.append(failure)

    def stop(self, reason: str) -> None:
        """Fail fast: tell every agent to stop its ranks (once), saying why."""
        if self.agents.stopping:
            return
        self.agents.stopping = True
        self.stopped_at = time.time()
        self.sink.notice(f"{reason}; stopping all ranks (grace period {self.options.grace_period:g}s)")
        self.agents.send_all(p.command(p.STOP))

    def check_interrupts(self) -> None:
        """A stop asked by distlaunch, or a signal: stop every rank; a second signal: kill them at once."""
        if self.stop_request is not None and self.stop_request.reason is not None:
            self.stop(self.stop_request.reason)
        if self.interrupts.first is None:
            return
        name = signal.Signals(self.interrupts.first).name
        if self.saving_for_signal:
            pass  # the save its SIGTERM asked for is under way: the save watch stops the job after it
        elif not self.agents.stopping:
            self.saving_for_signal = self.save_before_stopping(name)
            if not self.saving_for_signal:
                self.stop(f"received {name}")
        elif not self.interrupt_seen:  # a stop under way (a rank failed): say the signal came, and what a second does
            self.sink.notice(f"received {name}; already stopping all ranks (a second Ctrl-C kills them at once)")
        self.interrupt_seen = True
        if self.interrupts.count > 1 and self.kill_deadline is None:
            self.kill_deadline = time.monotonic() + KILL_CONFIRM_S
            self.sink.notice("second interrupt: killing all ranks now")
            self.agents.send_all(p.command(p.KILL))

    def save_before_stopping(self, name: str) -> bool:
        """A first SIGTERM (a preemption, an eviction, a time limit) to a job whose ranks save checkpoints: ask for
        a save and stop after it when it fits in the grace period; else say what the stop without it loses."""
        if name != "SIGTERM" or self.interrupts.count > 1 or self.saves.outcome is not None:
            return False
        if self.saves.inbox is not None and self.saves.inbox.stopped_by_command():
            return False  # 'distlaunch stop' stops as Ctrl-C does; 'stop --checkpoint' is the one that saves
        unfit = self.saves.fits(self.options.grace_period)
        if unfit is None:
            ask = SaveAsk("stop", name, exit_code=128 + signal.SIGTERM, budget_s=self.options.grace_period)
            self.saves.ask(ask, time.monotonic())
            return True
        if unfit != "no rank reports checkpoints":  # a job that saves nothing loses nothing it could have kept
            self.saves.stopped_unsaved = True  # the report says what is lost, once the ranks have ended
            self.sink.notice(f"received {name}; no save before the stop: {unfit}{time_limit_hint()}")
        return False


def _discard(events: queue.Queue) -> None:
    while True:
        events.get()
