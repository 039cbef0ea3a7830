"""``execute(plan)``: the only place with side effects. Starts one agent per node, streams rank output to
a sink, stops every rank everywhere when one fails or the user interrupts, and restarts if asked."""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from distlaunch import protocol as p
from distlaunch.contract.report import (
    HANG_CODE,
    HOST_SILENT_CODE,
    AttemptReport,
    RankExit,
    RunReport,
    exit_code_of,
)
from distlaunch.errors import UsageError
from distlaunch.launcher.dumps import AttemptFolder, FlightRecorderDumps
from distlaunch.launcher.goodput import AttemptTimes, StepTimeline, account
from distlaunch.launcher.hangwatch import HangWatch, StacksOnRequest, report_after
from distlaunch.launcher.heartbeats import HeartbeatWatch
from distlaunch.launcher.liveview import JobStatus, LiveView, starting_line
from distlaunch.launcher.output import RankOutput
from distlaunch.launcher.plan import LaunchPlan, NodePlan
from distlaunch.launcher.ranklogs import DEFAULT_MAX_BYTES, RankLogs
from distlaunch.launcher.requests import ForwardSignals, JobRequests, SaveAsk
from distlaunch.launcher.saves import SaveWatch, lost_work, time_limit_hint
from distlaunch.launcher.signals import SignalTrap, StopRequest
from distlaunch.launcher.stragglers import OnStraggler, StragglerWatch
from distlaunch.launcher.watch import Agents, Stop, Watch
from distlaunch.protocol import AgentConnection
from distlaunch.readable import plural

# Agents' events wait here for the supervision loop. Bounded: when rank output outruns the loop, the
# reader threads wait, the agents' pipes fill and the ranks are slowed, and the launcher's memory stays flat.
EVENT_QUEUE_SIZE = 256
KILL_CONFIRM_S = 1.5  # after a second interrupt: how long agents get to confirm before we leave
LOST_AGENT_CODE = 255  # an agent that vanished without reporting its ranks (host down, connection cut)


class Sink(Protocol):
    """Where a running job's output goes (the CLI renders it; tests collect it)."""

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None: ...

    def notice(self, text: str) -> None: ...

    def status(self, state: JobStatus) -> None:
        """The job as it is now (twice a second): a terminal draws it under the output; anything else ignores it."""


class ExecOptions(BaseModel):
    grace_period: float = p.GRACE_PERIOD_S  # seconds between SIGTERM and SIGKILL when stopping ranks
    max_restarts: int = 0
    log_dir: Path | None = None  # the rank logs' folder is <log_dir>/<job id>; None: the job's folder in the job store
    log_max_size: int = DEFAULT_MAX_BYTES  # a rank log this big is rotated (one previous part kept); 0: never
    workdir: str | None = None
    heartbeat_timeout: float = 30.0  # a host silent this long is given up (exit 3); 0: never
    local_ranks_filter: list[int] | None = None  # show only these local ranks' output (log files keep all)
    hang_timeout: float = 0.0  # no output and no distlaunch.progress() this long: stacks, stop, exit 124; 0: off
    hang_report: float = 1800.0  # the same, but the stacks are only printed (once per stall), the job runs on; 0: off
    on_straggler: OnStraggler = "warn"  # a rank named a straggler: say so; replace: also take its host out
    save_signal: str | None = "USR1"  # asks every rank for a checkpoint, then a stop (exit 75); None: not trapped
    forward_signals: list[str] = []  # signals passed on to every rank (USR2, ...)


Connect = Callable[[NodePlan, "queue.Queue[tuple[int, dict]]"], AgentConnection]
# Before the next attempt starts: the report so far, and that attempt's plan
Progress = Callable[[RunReport, LaunchPlan], None]


class CannotStart(Exception):
    """Some host cannot start its ranks (a script missing there, say): found before any rank started anywhere.
    ``problems``: host -> what its agent found (distlaunch/startcheck.py), for the launcher to put in words."""

    def __init__(self, problems: dict[str, list[dict]]):
        super().__init__(problems)
        self.problems = problems


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


class _Attempt:
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

    def after(self, attempt: _Attempt, restart_count: int) -> NextAttempt | None: ...


@dataclass
class Restarts:
    """The rule without spares: the same plan again, up to --max-restarts times, after a failure or a hang."""

    max_restarts: int
    notice: Callable[[str], None]

    def after(self, attempt: _Attempt, restart_count: int) -> NextAttempt | None:
        if restart_count >= self.max_restarts or not (attempt.failures or attempt.hangs.report):
            return None
        count = f"{restart_count + 1}/{self.max_restarts}"
        cause = "the hang" if attempt.hangs.report is not None else attempt.failures[0].what
        self.notice(f"restarting the job ({count}) after {cause}")
        return NextAttempt(attempt.plan, attempt.connect)


def execute(
    plan: LaunchPlan,
    options: ExecOptions,
    sink: Sink,
    connect: Connect,
    requests: JobRequests | None = None,
    stop_request: StopRequest | None = None,
    recovery: Recovery | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Run the plan to completion and report how it ended. After an attempt that did not finish, ``recovery``
    decides what comes next (default: the same plan, up to ``max_restarts`` times). ``requests`` (from
    ``launch``) brings what commands ask of the running job (stacks, checkpoints) and the signals it traps;
    ``stop_request`` a stop asked by distlaunch itself; ``progress`` is handed the report so far after each
    attempt (the job record's)."""
    _make_log_dir(options.log_dir)
    sink.notice(starting_line(plan))  # at once: importing torch on every rank takes seconds that look like a hang
    recovery = recovery or Restarts(options.max_restarts, sink.notice)
    started = time.monotonic()
    attempts: list[_Attempt] = []
    logs = RankLogs(plan, options.log_dir, sink.notice, options.log_max_size)
    step: NextAttempt | None = NextAttempt(plan, connect)
    with SignalTrap() as interrupts:  # first: stop in order; a second ^C: kill at once
        restart_count = 0
        while step is not None:
            logs.begin(restart_count, step.plan)
            attempt = _Attempt(
                step.plan, options, sink, step.connect, restart_count, interrupts, logs, requests, stop_request
            )
            attempt.dropped, attempt.added = step.dropped, step.added
            attempts.append(attempt)
            attempt.run()
            asked_to_stop = interrupts.first is not None or (stop_request is not None and stop_request.reason)
            asked_to_stop = asked_to_stop or attempt.saves.outcome is not None  # saved as asked, then stopped
            if asked_to_stop:
                break
            step = recovery.after(attempt, restart_count)
            if progress is not None and step is not None:  # the job goes on: its record says so (the end's own)
                progress(_report(attempts, interrupts, stop_request, round(time.monotonic() - started, 3)), step.plan)
            restart_count += 1
    return _report(attempts, interrupts, stop_request, wall_s=round(time.monotonic() - started, 3))


def _make_log_dir(log_dir: Path | None) -> None:
    """Make --log-dir before anything starts: a path that cannot be a folder is the user's to fix."""
    if log_dir is None:
        return
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = "is a file" if Path(log_dir).is_file() else f"cannot be created: {exc.strerror}"
        raise UsageError(f"--log-dir {str(log_dir)!r} {what}", "give a folder path that you can write to") from None


def _report(
    attempts: list[_Attempt], interrupts: SignalTrap, stop_request: StopRequest | None, wall_s: float
) -> RunReport:
    """How the job ended, as its last attempt ended: a signal, a stop distlaunch asked for, a hang, a silent
    host, a host taken out of the job with nothing to replace it, else the root cause's exit code."""
    last = attempts[-1]
    failures = last.failures
    # A rank that failed before the signal came is the outcome; the signal only met a job already stopping.
    failed_first = bool(failures) and interrupts.first_at is not None and failures[0].at <= interrupts.first_at
    interrupted = signal.Signals(interrupts.first).name if interrupts.first and not failed_first else None
    silent = last.heartbeats.silent
    hang = last.hangs.report  # how the job ended: a hang a restart recovered from is past
    stopped_by = None
    if interrupted:
        exit_code = 128 + interrupts.first
    elif stop_request is not None and stop_request.reason is not None and not failures:
        exit_code, stopped_by = stop_request.exit_code, stop_request.reason
    elif last.saves.outcome is not None and not failures:  # a save asked with a stop after it (or in its place)
        exit_code, stopped_by = last.saves.outcome
    elif hang is not None:
        exit_code = HANG_CODE
    elif silent:
        exit_code = HOST_SILENT_CODE
    elif last.quarantine and not failures:  # a watch took a host out (a straggler) and nothing could replace it
        exit_code, stopped_by = HOST_SILENT_CODE, "; ".join(f"{h}: {why}" for h, why in last.quarantine.items())
    else:
        exit_code = failures[0].exit_code if failures else 0
    times = [_times(a) for a in attempts]
    return RunReport(
        job_id=last.plan.job_id,
        exit_code=exit_code,
        world_size=last.plan.world_size,
        restarts=len(attempts) - 1,
        failures=failures,
        interrupted=interrupted,
        stopped_by=stopped_by,
        silent_hosts=silent,
        unconfirmed_hosts=last.unconfirmed,
        stragglers=sum(a.stragglers for a in attempts),
        stragglers_found=[s for a in attempts for s in a.straggling.found],
        hang=hang,
        wall_s=wall_s,
        attempts=[t.report for t in times],
        goodput=account(times, wall_s) if len(attempts) > 1 or last.steps.last_step is not None else None,
        saved_on_request=[s for a in attempts for s in a.saves.saved],
        lost_work=lost_work(last.steps) if last.saves.stopped_unsaved else None,
    )


def _times(attempt: _Attempt) -> AttemptTimes:
    """An attempt as the report lists it, and when its fault happened (the root cause's exit; the last message
    of a host given up; the last progress before a hang)."""
    plan = attempt.plan
    fault_at = None  # a silent host or a hang is detected a timeout after it happened, whatever failed since
    if attempt.heartbeats.silent and attempt.stopped_at is not None:
        fault_at = attempt.stopped_at - max(s.silent_s for s in attempt.heartbeats.silent)
    elif attempt.hangs.report is not None and attempt.stopped_at is not None:
        fault_at = attempt.stopped_at - attempt.hangs.report.timeout_s
    elif attempt.failures:
        fault_at = attempt.failures[0].at
    report = AttemptReport(
        restart=attempt.restart_count,
        hosts=[node.host for node in plan.nodes],
        world_size=plan.world_size,
        layout=str(plan.parallel),
        dropped=attempt.dropped,
        added=attempt.added,
        started_at=attempt.started_at,
        ended_at=attempt.ended_at,
        ended=_ending(attempt),
        first_step=attempt.steps.first_step,
        last_step=attempt.steps.last_step,
    )
    return AttemptTimes(report, attempt.steps, fault_at, attempt.stopped_at)


def _ending(attempt: _Attempt) -> str:
    """How an attempt ended, in a few words."""
    if attempt.hangs.report is not None:
        return "hung"
    if attempt.heartbeats.silent:
        return f"{', '.join(s.host for s in attempt.heartbeats.silent)} went silent"
    if attempt.failures:
        return attempt.failures[0].what
    if attempt.quarantine:
        return "; ".join(f"{host}: {why}" for host, why in attempt.quarantine.items())
    if attempt.saves.outcome is not None:  # stopped after a save it was asked for (or for want of one)
        return attempt.saves.outcome[1]
    return "stopped" if attempt.stopped_at is not None else "finished"
