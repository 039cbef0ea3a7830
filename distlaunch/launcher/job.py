"""``execute(plan)``: the only place with side effects. Starts one agent per node, streams rank output to
a sink, stops every rank everywhere when one fails or the user interrupts, and restarts if asked."""

from __future__ import annotations

import collections
import queue
import signal
import time
from pathlib import Path
from typing import Callable, Protocol

from pydantic import BaseModel

from distlaunch.errors import UsageError
from distlaunch.launcher.plan import LaunchPlan, NodePlan
from distlaunch.launcher.report import RankExit, RunReport, exit_code_of
from distlaunch.launcher.signals import SignalTrap
from distlaunch.launcher.transport import AgentConnection

TAIL_LINES = 10
LOST_AGENT_CODE = 255  # an agent that vanished without reporting its ranks (host down, connection cut)


class Sink(Protocol):
    """Where a running job's output goes (the CLI renders it; tests collect it)."""

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None: ...

    def notice(self, text: str) -> None: ...


class ExecOptions(BaseModel):
    grace_period: float = 10.0  # seconds between SIGTERM and SIGKILL when stopping ranks
    max_restarts: int = 0
    log_dir: Path | None = None
    workdir: str | None = None


Connect = Callable[[NodePlan, "queue.Queue[tuple[int, dict]]"], AgentConnection]


class _Attempt:
    """One start of every rank; ends when every agent has reported its ranks' exits."""

    def __init__(self, plan: LaunchPlan, options: ExecOptions, sink: Sink, connect: Connect, restart_count: int,
                 interrupts: SignalTrap):
        self.plan, self.options, self.sink, self.connect = plan, options, sink, connect
        self.restart_count, self.interrupts = restart_count, interrupts
        self.events: queue.Queue[tuple[int, dict]] = queue.Queue()
        self.host_of = {r.rank: n.host for n in plan.nodes for r in n.ranks}
        self.tails = {r: collections.deque(maxlen=TAIL_LINES) for r in self.host_of}
        self.exited: set[int] = set()
        self.failures: list[RankExit] = []
        self.stopping = False
        self.killed = False
        self.started_at = time.monotonic()
        self.logs: dict[int, object] = {}

    def payload(self, node: NodePlan) -> dict:
        return {"node_rank": node.node_rank, "ranks": [r.model_dump() for r in node.ranks],
                "restart_count": self.restart_count, "grace_period": self.options.grace_period,
                "workdir": self.options.workdir}

    def run(self) -> list[RankExit]:
        conns: list[AgentConnection] = []
        try:
            for node in self.plan.nodes:
                conn = self.connect(node, self.events)
                conns.append(conn)
                conn.start(self.payload(node))
            self.loop(conns)
        finally:
            for conn in conns:
                conn.close()
            for f in self.logs.values():
                f.close()
        return self.failures

    def loop(self, conns: list[AgentConnection]) -> None:
        pending = {c.node_rank for c in conns}
        while pending:
            self.check_interrupts(conns)
            try:
                node_rank, event = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            kind = event.get("ev")
            if kind == "out":
                self.on_output(event["rank"], event["fd"], event["line"])
            elif kind == "agent-out":
                self.sink.notice(f"{self.plan.nodes[node_rank].host}: {event['line']}")
            elif kind == "exit":
                self.on_exit(event["rank"], event["code"], conns)
            elif kind in ("done", "lost"):
                pending.discard(node_rank)
                if kind == "lost":
                    self.on_lost(self.plan.nodes[node_rank], conns)

    def on_output(self, rank: int, fd: int, line: str) -> None:
        self.tails[rank].append(line)
        self.sink.rank_line(self.host_of[rank], rank, fd, line)
        if self.options.log_dir is not None:
            log = self.logs.get(rank)
            if log is None:
                log = self.logs[rank] = open(Path(self.options.log_dir) / f"rank{rank}.log", "a", encoding="utf-8")
                if self.restart_count:
                    log.write(f"--- distlaunch: restart {self.restart_count} ---\n")
            log.write(line + "\n")
            log.flush()

    def on_exit(self, rank: int, returncode: int, conns: list[AgentConnection]) -> None:
        self.exited.add(rank)
        if returncode == 0 or self.stopping:
            return
        code, signame = exit_code_of(returncode)
        self.failures.append(RankExit(rank=rank, host=self.host_of[rank], exit_code=code, signal=signame,
                                      tail=list(self.tails[rank]), time_s=round(time.monotonic() - self.started_at, 3)))
        how = f"was killed by {signame}" if signame else f"exited with code {code}"
        self.stop(conns, f"rank {rank} on {self.host_of[rank]} {how}")

    def on_lost(self, node: NodePlan, conns: list[AgentConnection]) -> None:
        lost = [r.rank for r in node.ranks if r.rank not in self.exited]
        if not lost or self.stopping:
            return
        for rank in lost:
            self.failures.append(RankExit(rank=rank, host=node.host, exit_code=LOST_AGENT_CODE,
                                          tail=list(self.tails[rank]) + ["distlaunch: lost contact with this node's agent"],
                                          time_s=round(time.monotonic() - self.started_at, 3)))
        self.stop(conns, f"lost contact with the agent on {node.host}")

    def stop(self, conns: list[AgentConnection], reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.sink.notice(f"{reason}; stopping all ranks (grace period {self.options.grace_period:g}s)")
        for conn in conns:
            conn.send({"cmd": "stop"})

    def check_interrupts(self, conns: list[AgentConnection]) -> None:
        if self.interrupts.first is None:
            return
        if not self.stopping:
            self.stop(conns, f"received {signal.Signals(self.interrupts.first).name}")
        if self.interrupts.count > 1 and not self.killed:
            self.killed = True
            self.sink.notice("second interrupt: killing all ranks now")
            for conn in conns:
                conn.send({"cmd": "kill"})


def execute(plan: LaunchPlan, options: ExecOptions, sink: Sink, connect: Connect) -> RunReport:
    """Run the plan to completion (with up to ``max_restarts`` restarts) and report how it ended."""
    if options.log_dir is not None:
        try:
            Path(options.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--log-dir {str(options.log_dir)!r} cannot be created: {exc.strerror}",
                             "give a folder path that you can write to") from None
    started = time.monotonic()
    failures: list[RankExit] = []
    restarts = 0
    with SignalTrap() as interrupts:  # first: stop in order; a second ^C: kill at once
        for restart_count in range(options.max_restarts + 1):
            restarts = restart_count
            failures = _Attempt(plan, options, sink, connect, restart_count, interrupts).run()
            if not failures or interrupts.first is not None or restart_count == options.max_restarts:
                break
            sink.notice(f"restarting the job ({restart_count + 1}/{options.max_restarts})")
    interrupted = signal.Signals(interrupts.first).name if interrupts.first else None
    if interrupted:
        exit_code = 128 + interrupts.first
    else:
        exit_code = failures[0].exit_code if failures else 0
    return RunReport(job_id=plan.job_id, exit_code=exit_code, world_size=plan.world_size, restarts=restarts,
                     failures=failures, interrupted=interrupted, wall_s=round(time.monotonic() - started, 3))
