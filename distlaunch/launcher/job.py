"""``execute(plan)``: the only place with side effects. Starts one agent per node, streams rank output to
a sink, stops every rank everywhere when one fails or the user interrupts, and restarts if asked."""

from __future__ import annotations

import collections
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from distlaunch import protocol as p
from distlaunch.contract.report import (
    HANG_CODE,
    HOST_SILENT_CODE,
    HangReport,
    RankExit,
    RunReport,
    SilentHost,
    exit_code_of,
)
from distlaunch.errors import UsageError
from distlaunch.files import os_error_words
from distlaunch.launcher.nccl_trace import READ_HINT, BadTrace, cut_note, store_nccl_trace
from distlaunch.launcher.plan import LaunchPlan, NodePlan
from distlaunch.launcher.ranklogs import RankLogs, job_folder
from distlaunch.launcher.signals import SignalTrap, StackRequests, StopRequest
from distlaunch.launcher.stacks import ranges, summarise_stacks, write_rank_stacks
from distlaunch.protocol import AgentConnection

TAIL_LINES = 10
# Agents' events wait here for the supervision loop. Bounded: when rank output outruns the loop, the
# reader threads wait, the agents' pipes fill and the ranks are slowed, and the launcher's memory stays flat.
EVENT_QUEUE_SIZE = 256
STACKS_TIMEOUT_S = 30.0  # how long agents get to send their ranks' stacks (after a hang, or when asked)
KILL_CONFIRM_S = 1.5  # after a second interrupt: how long agents get to confirm before we leave
LOST_AGENT_CODE = 255  # an agent that vanished without reporting its ranks (host down, connection cut)


class Sink(Protocol):
    """Where a running job's output goes (the CLI renders it; tests collect it)."""

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None: ...

    def notice(self, text: str) -> None: ...


class ExecOptions(BaseModel):
    grace_period: float = p.GRACE_PERIOD_S  # seconds between SIGTERM and SIGKILL when stopping ranks
    max_restarts: int = 0
    log_dir: Path | None = None
    workdir: str | None = None
    heartbeat_timeout: float = 30.0  # a host silent this long is given up (exit 3); 0: never
    local_ranks_filter: list[int] | None = None  # show only these local ranks' output (log files keep all)
    hang_timeout: float = 0.0  # no output and no distlaunch.progress() this long: stacks, stop, exit 124; 0: off


Connect = Callable[[NodePlan, "queue.Queue[tuple[int, dict]]"], AgentConnection]


class CannotStart(Exception):
    """Some host cannot start its ranks (a script missing there, say): found before any rank started anywhere.
    ``problems``: host -> what its agent found (distlaunch/startcheck.py), for the launcher to put in words."""

    def __init__(self, problems: dict[str, list[dict]]):
        super().__init__(problems)
        self.problems = problems


class _Attempt:
    """One start of every rank; ends when every agent has reported its ranks' exits."""

    def __init__(
        self,
        plan: LaunchPlan,
        options: ExecOptions,
        sink: Sink,
        connect: Connect,
        restart_count: int,
        interrupts: SignalTrap,
        logs: RankLogs,
        requests: StackRequests | None = None,
        stop_request: StopRequest | None = None,
    ):
        self.plan, self.options, self.sink, self.connect, self.logs = plan, options, sink, connect, logs
        self.restart_count, self.interrupts, self.requests = restart_count, interrupts, requests
        self.stop_request = stop_request
        self.events: queue.Queue[tuple[int, dict]] = queue.Queue(EVENT_QUEUE_SIZE)
        self.host_of = {r.rank: n.host for n in plan.nodes for r in n.ranks}
        self.node_of = {n.node_rank: n for n in plan.nodes}  # a per-node launch holds one node, not node 0
        self.local_rank_of = {r.rank: r.local_rank for n in plan.nodes for r in n.ranks}
        self.placed = {r.rank: (n, r) for n in plan.nodes for r in n.ranks}  # rank -> its node and its plan
        self.tails = {r: collections.deque(maxlen=TAIL_LINES) for r in self.host_of}
        self.exited: set[int] = set()
        self.failures: list[RankExit] = []
        self.stopping = False
        self.interrupt_seen = False
        self.killed = False
        # Wall clock, as agents stamp exits with theirs: failures are ordered by when they happened, not by
        # which host's report arrived first.
        self.started_at = time.time()
        self.silent: list[SilentHost] = []
        self.unconfirmed: list[str] = []  # hosts whose ranks we could not confirm stopped
        self.kill_deadline: float | None = None
        self.stragglers = 0  # processes of this job that outlived their rank's process group, ended by agents
        self.progress_at = time.monotonic()  # the last output or progress() of any rank
        self.stacks: dict[int, dict] | None = None  # once a hang was seen: rank -> its stacks event
        self.stacks_deadline = 0.0
        self.hang: HangReport | None = None
        self.asked: dict[int, dict] | None = None  # stacks asked for by 'distlaunch stacks', while they come in
        self.asked_deadline = 0.0
        self.folder: Path | None = None  # this attempt's stacks folder, once something is written there
        self.nccl_traces: list[int | None] = []  # ranks whose NCCL flight recorder dumps were stored
        # A job on several hosts is gated: no rank starts until every agent has checked that its own can.
        self.gated = any(not node.local for node in plan.nodes)
        self.unready = {n.node_rank for n in plan.nodes} if self.gated else set()
        self.problems: dict[str, list[dict]] = {}  # host -> what keeps its ranks from starting
        self.conn_of: dict[int, AgentConnection] = {}  # node rank -> its agent's connection, once started

    def payload(self, node: NodePlan) -> dict:
        return {
            "node_rank": node.node_rank,
            "ranks": [r.model_dump() for r in node.ranks],
            "restart_count": self.restart_count,
            "grace_period": self.options.grace_period,
            "workdir": node.workdir or self.options.workdir,  # the plan's: absolute, as every host must read it
            "heartbeat_timeout": self.options.heartbeat_timeout,
            "hang_timeout": self.options.hang_timeout,
            "gate": self.gated,
        }

    def run(self) -> list[RankExit]:
        conns: list[AgentConnection] = []
        try:
            for node in self.plan.nodes:
                conn = self.connect(node, self.events)
                conns.append(conn)
                conn.start(self.payload(node))
            self.loop(conns)
            if self.problems:
                raise CannotStart(self.problems)
            self.failures.sort(key=lambda f: f.time_s)  # root cause first (stable: ties keep arrival order)
            if self.nccl_traces:
                ranks = sorted(r for r in self.nccl_traces if r is not None)
                folder = self.stacks_folder()
                self.sink.notice(
                    f"NCCL flight recorder dumps{f' of ranks {ranges(ranks)}' if ranks else ''}: {folder} "
                    f"(read them with: {READ_HINT.format(folder=folder)})"
                )
        finally:
            # Readers still posting (the loop ended early) must not block on the full queue while we close.
            threading.Thread(target=_discard, args=(self.events,), daemon=True).start()
            given_up = {s.host for s in self.silent} | set(self.unconfirmed)
            for conn in conns:
                conn.close(wait_s=0.5 if conn.host in given_up else None)
            self.logs.close()
        return self.failures

    def loop(self, conns: list[AgentConnection]) -> None:
        self.conn_of = {c.node_rank: c for c in conns}
        pending = dict(self.conn_of)
        heartbeat_at = turn_at = time.monotonic()
        while pending:
            now = time.monotonic()
            if self.options.heartbeat_timeout and now - turn_at > self.options.heartbeat_timeout / 2:
                # This launcher was frozen (SIGSTOP, a suspended machine): the agents' silence was ours, and what
                # they sent meanwhile is still queued. Judge them on a fresh window, after reading it.
                for conn in pending.values():
                    conn.last_seen = max(conn.last_seen, now)
            turn_at = now
            self.check_interrupts(conns)
            if self.kill_deadline is not None and time.monotonic() > self.kill_deadline:
                self.unconfirmed = [c.host for c in pending.values()]
                self.sink.notice(f"could not confirm that every rank stopped on {', '.join(self.unconfirmed)}")
                return
            if self.options.heartbeat_timeout and time.monotonic() >= heartbeat_at:
                heartbeat_at = time.monotonic() + self.options.heartbeat_timeout / 3
                self.check_heartbeats(conns, pending)
            self.check_hang(conns, pending)
            self.check_requested_stacks(pending)
            try:
                node_rank, event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            kind = event.get("ev")
            if kind in (p.OUT, p.PROGRESS):
                self.progress_at = time.monotonic()
            if kind == p.READY:
                self.on_ready(node_rank, event.get("problems") or [], conns)
            elif kind == p.STARTED:
                self.on_started(event["rank"])
            elif kind == p.OUT:
                self.on_output(event["rank"], event["fd"], event["line"])
            elif kind == p.STACKS:
                for gathering in (self.stacks, self.asked):  # a hang and a request may gather at once
                    if gathering is not None:
                        gathering[event["rank"]] = event
            elif kind == p.AGENT_OUT:
                self.sink.notice(f"{self.node_of[node_rank].host}: {event['line']}")
            elif kind == p.EXIT:
                self.on_exit(event, self.conn_of[node_rank], conns)
            elif kind == p.STRAGGLERS:
                self.stragglers += event["count"]
                host = self.node_of[node_rank].host
                self.sink.notice(f"ended {event['count']} stray process(es) of this job on {host}: {event['pids']}")
            elif kind == p.NCCL_TRACE:
                self.on_nccl_trace(event)
            elif kind in (p.DONE, p.LOST) and node_rank in pending:
                del pending[node_rank]
                if kind == p.LOST:
                    self.on_lost(self.node_of[node_rank], conns)

    def check_hang(self, conns: list[AgentConnection], pending: dict[int, AgentConnection]) -> None:
        """No progress for --hang-timeout: ask every agent for its ranks' stacks; once they are in, stop."""
        timeout = self.options.hang_timeout
        now = time.monotonic()
        if self.stacks is None:
            if not timeout or self.stopping or now - self.progress_at <= timeout:
                return
            self.sink.notice(f"no rank made progress for {now - self.progress_at:.0f}s: gathering every rank's stack")
            self.stacks, self.stacks_deadline = {}, now + STACKS_TIMEOUT_S
            for conn in pending.values():
                conn.send(p.command(p.ASK_STACKS))
            return
        if self.hang is not None:
            return
        if self.waiting_ranks(pending) - set(self.stacks) and now < self.stacks_deadline:
            return
        self.hang = self.hang_report()
        self.sink.notice(f"hang: {self.hang.summary}")
        if self.hang.folder:
            self.sink.notice(f"full stacks: {self.hang.folder}")
        self.stop(conns, f"the job hung (no progress for {timeout:g}s, --hang-timeout)")

    def hang_report(self) -> HangReport:
        """Where the ranks wait, and every rank's full stack written in this attempt's folder (a full disk costs
        the files, never the report)."""
        groups, text = summarise_stacks(self.stacks or {}, self.host_of)
        folder = None
        try:
            folder = self.stacks_folder()
            write_rank_stacks(folder, self.stacks or {}, self.host_of)
        except OSError as exc:
            where = f" in {folder}" if folder else ""
            self.sink.notice(f"cannot write every rank's full stack{where}: {os_error_words(exc)}")
            folder = None
        return HangReport(
            timeout_s=self.options.hang_timeout, summary=text, folder=str(folder) if folder else None, groups=groups
        )

    def stacks_folder(self) -> Path:
        """Where this attempt's stacks and NCCL flight recorder dumps go (one folder, made once)."""
        if self.folder is None:
            restart = self.restart_count
            folder = job_folder(self.plan, self.options.log_dir)
            self.folder = folder / (f"stacks-restart{restart}" if restart else "stacks")
        return self.folder

    def on_nccl_trace(self, event: dict) -> None:
        """Store a rank's flight recorder dump; a full disk or a broken event costs the dump, never the job."""
        try:
            path = store_nccl_trace(self.stacks_folder(), event)
            note = cut_note(event, path) if event.get("last", True) else None
        except (OSError, BadTrace) as exc:
            self.sink.notice(f"cannot store the NCCL flight recorder dump of rank {event.get('rank')}: {exc}")
            return
        if not event.get("last", True):
            return  # more pieces follow
        self.nccl_traces.append(event.get("rank"))
        if note:
            self.sink.notice(note)

    def waiting_ranks(self, pending: dict[int, AgentConnection]) -> set[int]:
        """Ranks still running under an agent that still answers: those whose stacks can come."""
        return {r.rank for c in pending.values() for r in self.node_of[c.node_rank].ranks} - self.exited

    def check_requested_stacks(self, pending: dict[int, AgentConnection]) -> None:
        """'distlaunch stacks' signalled us: gather every rank's stack as on a hang, write a new numbered
        snapshot into the job's folder, and let the job run on."""
        requests = self.requests
        if requests is None or requests.folder is None:
            return
        now = time.monotonic()
        if self.asked is None:
            if not requests.waiting or not pending:
                return
            requests.take()
            self.asked, self.asked_deadline = {}, now + STACKS_TIMEOUT_S
            for conn in pending.values():
                conn.send(p.command(p.ASK_STACKS))
            return
        if self.waiting_ranks(pending) - set(self.asked) and now < self.asked_deadline:
            return
        from distlaunch.launcher.snapshots import write_snapshot  # the job registry owns its folder's files

        try:
            snapshot = write_snapshot(requests.folder, self.plan.job_id, self.asked, self.host_of)
        except OSError as exc:  # a full disk costs the answer, never the job
            self.sink.notice(f"cannot write the requested stacks into {requests.folder}: {exc}")
        else:
            self.sink.notice(f"stacks on request: {snapshot.summary}")
            self.sink.notice(f"full stacks: {snapshot.folder}")
        self.asked = None

    def check_heartbeats(self, conns: list[AgentConnection], pending: dict[int, AgentConnection]) -> None:
        """Send every agent our heartbeat; give up a host whose agent has been silent for the timeout."""
        now, now_wall = time.monotonic(), time.time()
        for conn in list(pending.values()):
            conn.send(p.command(p.PING))
            silent_s = now - conn.last_seen
            if silent_s <= self.options.heartbeat_timeout:
                continue
            del pending[conn.node_rank]  # nothing more can be expected from it
            self.silent.append(SilentHost(host=conn.host, silent_s=round(silent_s, 1)))
            node = self.node_of[conn.node_rank]
            for rank in (r.rank for r in node.ranks if r.rank not in self.exited):
                self.failures.append(
                    RankExit(
                        rank=rank,
                        host=node.host,
                        exit_code=HOST_SILENT_CODE,
                        tail=[*list(self.tails[rank]), f"distlaunch: {node.host} went silent"],
                        time_s=self.since_start(now_wall),
                        at=now_wall,
                    )
                )
            self.stop(
                conns,
                f"{conn.host} has been silent for {silent_s:.1f}s (no message from its agent; "
                f"--heartbeat-timeout {self.options.heartbeat_timeout:g})",
            )

    def on_ready(self, node_rank: int, problems: list[dict], conns: list[AgentConnection]) -> None:
        """A gated agent has checked its host. Once every one has: go, or (a host cannot start its ranks)
        send every agent away without a rank started anywhere."""
        self.unready.discard(node_rank)
        if problems:
            self.problems[self.node_of[node_rank].host] = problems
        if self.unready or self.stopping:
            return
        if self.problems:
            self.stopping = True  # no rank started: nothing to stop, nothing to report as stopped
        for conn in conns:
            conn.send(p.command(p.STOP if self.problems else p.GO))

    def on_started(self, rank: int) -> None:
        self.logs.started(rank, *self.placed[rank])

    def on_output(self, rank: int, fd: int, line: str) -> None:
        self.tails[rank].append(line)
        shown = self.options.local_ranks_filter
        if shown is None or self.local_rank_of[rank] in shown:
            self.sink.rank_line(self.host_of[rank], rank, fd, line)
        self.logs.line(rank, fd, line, *self.placed[rank])

    def since_start(self, at: float) -> float:
        return round(at - self.started_at, 3)

    def on_exit(self, event: dict, conn: AgentConnection, conns: list[AgentConnection]) -> None:
        """A rank ended. A failure on its own (before its agent was told to stop) is kept even while stopping:
        a crash makes its peers fail milliseconds later, and their host's report may arrive first."""
        rank = event["rank"]
        self.exited.add(rank)
        # on our clock: hosts' clocks may disagree by seconds, and the root cause is the earliest failure
        at = event["at"] - conn.clock_offset if event.get("at") else time.time()
        if event.get("stopped") and not self.stopping:
            self.on_stopped_by_agent(rank, at, conns)
            return
        if event["code"] == 0 or event.get("stopped", self.stopping):
            return
        code, signame = exit_code_of(event["code"])
        failure = RankExit(
            rank=rank,
            host=self.host_of[rank],
            exit_code=code,
            signal=signame,
            tail=list(self.tails[rank]),
            error=event.get("error"),
            time_s=self.since_start(at),
            at=at,
        )
        first = min(self.failures, key=lambda f: f.time_s, default=None)
        self.failures.append(failure)
        if not self.stopping:
            self.stop(conns, failure.what)
        elif first is not None and failure.time_s < first.time_s:
            earlier = f"{first.time_s - failure.time_s:.3f}s before rank {first.rank} did"
            self.sink.notice(f"{failure.what}, {earlier}: it failed first (the root cause)")
        elif first is None and (self.interrupts.first_at is None or at <= self.interrupts.first_at):
            # the job is stopping for a signal (or a hang) that came after this failure
            self.sink.notice(f"{failure.what}, before the stop: it failed first (the root cause)")

    def on_stopped_by_agent(self, rank: int, at: float, conns: list[AgentConnection]) -> None:
        """A rank its agent stopped though this launcher never asked: the agent heard nothing from us for the
        heartbeat timeout (this machine frozen or suspended, the link cut) or was signalled itself. Whatever
        the rank's code, the job did not finish: a failure of that host (exit 3), never a success."""
        host = self.host_of[rank]
        self.failures.append(
            RankExit(
                rank=rank,
                host=host,
                exit_code=HOST_SILENT_CODE,
                tail=[*list(self.tails[rank]), "distlaunch: stopped by its agent, not by the launcher"],
                time_s=self.since_start(at),
                at=at,
            )
        )
        self.stop(
            conns,
            f"the agent on {host} stopped its ranks on its own: it heard nothing from this launcher for "
            f"--heartbeat-timeout {self.options.heartbeat_timeout:g}s (was this machine frozen or suspended?), "
            "or it was signalled",
        )

    def on_lost(self, node: NodePlan, conns: list[AgentConnection]) -> None:
        lost = [r.rank for r in node.ranks if r.rank not in self.exited]
        if not lost or self.stopping:
            return
        now = time.time()
        for rank in lost:
            self.failures.append(
                RankExit(
                    rank=rank,
                    host=node.host,
                    exit_code=LOST_AGENT_CODE,
                    tail=[*list(self.tails[rank]), "distlaunch: lost contact with this node's agent"],
                    time_s=self.since_start(now),
                    at=now,
                )
            )
        self.stop(conns, f"lost contact with the agent on {node.host}")

    def stop(self, conns: list[AgentConnection], reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.sink.notice(f"{reason}; stopping all ranks (grace period {self.options.grace_period:g}s)")
        for conn in conns:
            conn.send(p.command(p.STOP))

    def check_interrupts(self, conns: list[AgentConnection]) -> None:
        if self.stop_request is not None and self.stop_request.reason is not None:
            self.stop(conns, self.stop_request.reason)
        if self.interrupts.first is None:
            return
        if not self.stopping:
            self.stop(conns, f"received {signal.Signals(self.interrupts.first).name}")
        elif not self.interrupt_seen:  # a stop under way (a rank failed): say the signal came, and what a second does
            self.sink.notice(
                f"received {signal.Signals(self.interrupts.first).name}; already stopping all ranks "
                "(a second Ctrl-C kills them at once)"
            )
        self.interrupt_seen = True
        if self.interrupts.count > 1 and not self.killed:
            self.killed = True
            self.kill_deadline = time.monotonic() + KILL_CONFIRM_S
            self.sink.notice("second interrupt: killing all ranks now")
            for conn in conns:
                conn.send(p.command(p.KILL))


def _discard(events: queue.Queue) -> None:
    while True:
        events.get()


def execute(
    plan: LaunchPlan,
    options: ExecOptions,
    sink: Sink,
    connect: Connect,
    requests: StackRequests | None = None,
    stop_request: StopRequest | None = None,
) -> RunReport:
    """Run the plan to completion (with up to ``max_restarts`` restarts) and report how it ended; ``requests``
    (from ``launch``) brings 'distlaunch stacks' signals, answered while the job runs on; ``stop_request``
    a stop asked by distlaunch itself."""
    if options.log_dir is not None:
        try:
            Path(options.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            what = "is a file" if Path(options.log_dir).is_file() else f"cannot be created: {exc.strerror}"
            raise UsageError(
                f"--log-dir {str(options.log_dir)!r} {what}", "give a folder path that you can write to"
            ) from None
    started = time.monotonic()
    failures: list[RankExit] = []
    restarts = 0
    attempt = None
    stragglers = 0
    logs = RankLogs(plan, options.log_dir, sink.notice)
    with SignalTrap() as interrupts:  # first: stop in order; a second ^C: kill at once
        for restart_count in range(options.max_restarts + 1):
            restarts = restart_count
            logs.begin(restart_count)
            attempt = _Attempt(plan, options, sink, connect, restart_count, interrupts, logs, requests, stop_request)
            failures = attempt.run()
            stragglers += attempt.stragglers
            if attempt.hang is not None and restart_count < options.max_restarts:
                sink.notice(f"restarting the job after the hang ({restart_count + 1}/{options.max_restarts})")
                continue
            asked_to_stop = interrupts.first is not None or (stop_request is not None and stop_request.reason)
            if not failures or asked_to_stop or restart_count == options.max_restarts:
                break
            sink.notice(f"restarting the job ({restart_count + 1}/{options.max_restarts}) after {failures[0].what}")
    # A rank that failed before the signal came is the outcome; the signal only met a job already stopping.
    failed_first = bool(failures) and interrupts.first_at is not None and failures[0].at <= interrupts.first_at
    interrupted = signal.Signals(interrupts.first).name if interrupts.first and not failed_first else None
    silent = attempt.silent if attempt else []
    stopped_by = None
    if interrupted:
        exit_code = 128 + interrupts.first
    elif stop_request is not None and stop_request.reason is not None and not failures:
        exit_code, stopped_by = stop_request.exit_code, stop_request.reason
    elif attempt is not None and attempt.hang is not None:
        exit_code = HANG_CODE
    elif silent:
        exit_code = HOST_SILENT_CODE
    else:
        exit_code = failures[0].exit_code if failures else 0
    return RunReport(
        job_id=plan.job_id,
        exit_code=exit_code,
        world_size=plan.world_size,
        restarts=restarts,
        failures=failures,
        interrupted=interrupted,
        stopped_by=stopped_by,
        silent_hosts=silent,
        unconfirmed_hosts=attempt.unconfirmed if attempt else [],
        stragglers=stragglers,
        hang=attempt.hang if attempt else None,  # how the job ended: a hang a restart recovered from is past
        wall_s=round(time.monotonic() - started, 3),
    )
