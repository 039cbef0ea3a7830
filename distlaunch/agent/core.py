"""The agent's supervision core: it starts the node's ranks, obeys the launcher's commands and reports each
rank's exit; its collaborators do the rest (see __init__.py), the ranks' process groups and their stop
(processes.py) among them.

Standard library only: it runs on remote hosts with whatever Python they have, from the floor in
distlaunch/protocol.py (PYTHON_FLOOR) on, and it must start fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import sys
import time

from distlaunch import protocol as p
from distlaunch.agent.channel import Events, Lines
from distlaunch.agent.diagnosis import FlightRecorder, Stacks
from distlaunch.agent.liveness import Heartbeat, Progress
from distlaunch.agent.output import RankOutput
from distlaunch.agent.processes import EXITED, RankProcesses
from distlaunch.agent.rankenv import flight_recorder_vars, rank_vars
from distlaunch.agent.ranks import (
    Rank,
    base_env,
    binding,
    cpus_of,
    rank_argv,
    read_error_file,
    spawn,
    start_error,
    start_exit_code,
)
from distlaunch.agent.requests import RankRequests
from distlaunch.agent.scratch import make_scratch
from distlaunch.agent.strays import end_stragglers
from distlaunch.agent.warm import READY_TIMEOUT_S, Preloaded, WarmProc
from distlaunch.errors import UsageError
from distlaunch.hostprobe import inventory
from distlaunch.startcheck import MODULE_CHECK_TIMEOUT_S, program_index, start_problems

# With the launcher gone nobody waits for a graceful end, and its ranks must be gone within 5 s
# (a dead launcher must not leave a GPU job running): cap the grace period then.
_ORPHAN_GRACE_S = 3.0


class Agent:
    """Supervises one node's ranks from start to end, on the plan ``node``; events go to ``out``."""

    def __init__(
        self,
        node: dict,
        out=sys.stdout,
        commands: Lines | None = None,
        plan_at: float | None = None,
        host: dict | None = None,
    ):
        self.node = node
        self.host = host  # this host's inventory (hostprobe.py), as its hello told it; probed when first needed
        self.plan_at = plan_at  # our wall clock when the plan came: the launcher places our clock by it
        self.sel = selectors.DefaultSelector()
        self.processes = RankProcesses(self.sel, float(node.get("grace_period", p.GRACE_PERIOD_S)))
        self.ranks = self.processes.ranks  # the one list: collaborators are handed it
        self.go = False  # a gated plan's ranks start only once the launcher says so
        self.stdin_open = True
        self.commands = commands or Lines(0)
        heartbeat_timeout = float(node.get("heartbeat_timeout") or 0)
        self.events = Events(out, patience=max(heartbeat_timeout, 5.0))
        self.output = RankOutput(self.sel, self.events)
        self.events.on_backlog = self.output.pause
        self.heartbeat = Heartbeat(heartbeat_timeout, self.events)
        hang_timeout = float(node.get("hang_timeout") or 0)
        # Every job: stacks can be asked for at any time (distlaunch stacks), not only on a hang.
        self.scratch = make_scratch()
        self.progress = Progress(self.scratch, self.events)  # every job: stragglers and goodput read it too
        self.recorder = FlightRecorder(self.scratch, bool(hang_timeout), self.events)
        self.stacks = Stacks(self.scratch, self.events, self.recorder)
        self.requests = RankRequests(self.scratch)
        self.preloaded: Preloaded | None = None  # the warm start's process (warm.py), from run() to start()

    def rank_env(self, spec: dict) -> dict:
        """A rank's environment: the node's and the plan's, then the files it and this agent talk through, and
        where the flight recorder dumps (rankenv.py: what the plan shows, with this agent's scratch folder)."""
        env = base_env(self.node, spec, self.scratch)
        env.update(rank_vars(spec["rank"], spec["argv"], self.scratch))
        if self.recorder.enabled:
            env.update(flight_recorder_vars(self.scratch, env))
        return env

    def bindings(self) -> list[list[int] | None]:
        """Each rank's CPUs on this host (placement.py), in the plan's order; a bad --cpu-bind: UsageError."""
        if self.host is None:
            self.host = inventory()
        return [binding(self.node, spec, self.host) for spec in self.node["ranks"]]

    def start(self) -> None:
        """Start the node's ranks, each on its CPUs (forked from the preloaded process where there is one); one
        that cannot start is reported at once, as a shell would (126, 127), and a --cpu-bind this host cannot
        honour starts none (2)."""
        workdir = self.node.get("workdir") or None
        try:
            bound = self.bindings()
        except UsageError as exc:
            for spec in self.node["ranks"]:
                self.events.emit(ev=p.OUT, rank=spec["rank"], fd=2, line=f"distlaunch: {exc}")
                self.events.emit(ev=p.EXIT, rank=spec["rank"], code=2, at=time.time(), stopped=False)
            return
        warm = self.warmed()
        if self.processes.stopping:  # a stop came while the host imported: no rank starts, warm or cold
            return
        for spec, cpus in zip(self.node["ranks"], bound, strict=True):
            with contextlib.suppress(OSError):  # an earlier attempt's error must not be blamed on this one
                os.unlink(spec["env"].get("TORCHELASTIC_ERROR_FILE") or "")
            env = self.rank_env(spec)
            proc = None
            if warm is not None and warm.fits(env):
                with contextlib.suppress(OSError):  # a rank the preloaded process cannot fork starts cold
                    proc = warm.spawn(spec["argv"][program_index(spec["argv"])[0] :], env, workdir, cpus)
            try:
                proc = proc or spawn(rank_argv(spec["argv"]), env, workdir, cpus)
            except OSError as exc:
                self.events.emit(ev=p.OUT, rank=spec["rank"], fd=2, line=start_error(spec["argv"][0], exc, workdir))
                self.events.emit(ev=p.EXIT, rank=spec["rank"], code=start_exit_code(exc), at=time.time(), stopped=False)
                continue
            rank = Rank(spec, proc)
            self.processes.add(rank)
            self.output.watch(rank)
            warm_start = isinstance(proc, WarmProc)
            self.events.emit(ev=p.STARTED, rank=rank.rank, pid=proc.pid, cpus=cpus_of(proc.pid), warm=warm_start)
        if warm is not None:
            warm.close()

    def warmed(self) -> Preloaded | None:
        """The preloaded process once its imports are done, the launcher's commands heard meanwhile; None when the
        ranks start cold (nothing preloaded, the imports failed: said on the first rank's stderr, or a stop came)."""
        warm, deadline = self.preloaded, time.monotonic() + READY_TIMEOUT_S
        while warm is not None and warm.wait_ready(0.05) is None and time.monotonic() < deadline:
            if self.sel.select(timeout=0):
                self.read_commands()
            self.check_heartbeat()
            if self.processes.stopping:
                break
        if warm is None or warm.ready:
            return warm
        if warm.ready is False:
            why = f"distlaunch: preloading {', '.join(self.node['preload'])} failed on this host ({warm.error}); its ranks start cold"
            self.events.emit(ev=p.OUT, rank=self.node["ranks"][0]["rank"], fd=2, line=why)
        warm.close()
        self.preloaded = None
        return None

    def read_commands(self) -> None:
        """Take the launcher's commands; its end of the channel closing is an order to stop."""
        lines = self.commands.read()
        self.heartbeat.heard()
        if lines is None:  # the launcher is gone: nobody will ever tell us to stop, so stop now
            self.stdin_open = False
            self.sel.unregister(self.commands.fd)
            self.processes.begin_stop(_ORPHAN_GRACE_S)
            return
        self.handle(lines)

    def handle(self, lines: list[str]) -> None:
        """Obey the launcher's commands, one per line."""
        for line in lines:
            message = json.loads(line)
            cmd = message.get("cmd")
            if cmd == p.STOP:
                self.processes.begin_stop()
            elif cmd == p.KILL:
                self.processes.kill()
            elif cmd == p.GO:
                self.go = True
            elif cmd == p.ASK_STACKS:
                self.stacks.send(self.ranks)
            elif cmd == p.SAVE:
                self.requests.save(self.ranks, message)
            elif cmd == p.SIGNAL:
                self.requests.signal(self.ranks, message.get("sig"))
            # "hb" needs nothing: any line counts as a sign of life

    def check_heartbeat(self) -> None:
        """Send ours when due; stop the ranks when the launcher has been silent for the whole timeout."""
        if self.heartbeat.check() and self.stdin_open and self.processes.stop_deadline is None:
            self.processes.begin_stop(_ORPHAN_GRACE_S)  # a frozen or cut-off launcher looks like this, not like EOF

    def reap(self) -> None:
        """Report the ranks that ended (step() has stamped them), once their pipes are drained."""
        now = time.monotonic()
        for rank in self.ranks:
            if rank.returncode is not None and not rank.reported:
                if not self.output.finished(rank, now):
                    continue
                rank.reported = True
                self.progress.check(self.ranks, at_once=True)  # its last report first: the launcher counts its steps
                error = read_error_file(rank.error_file) if rank.returncode else None
                self.events.emit(
                    ev=p.EXIT,
                    rank=rank.rank,
                    code=rank.returncode,
                    at=rank.exit_time,
                    stopped=rank.stopped,
                    **({"error": error} if error else {}),
                )

    def run(self) -> int:
        """Start the ranks (once cleared), supervise them to their end, clean up after them; the exit code."""
        self.sel.register(self.commands.fd, selectors.EVENT_READ, None)
        if self.events.fd is not None:
            os.set_blocking(self.events.fd, False)
        self.handle(self.commands.split())  # commands that arrived together with the node plan
        envs = [self.rank_env(spec) for spec in self.node["ranks"]]
        self.preloaded = Preloaded.for_node(self.node, envs, self.node.get("workdir") or None)  # imports meanwhile
        if self.cleared():
            self.start()
        elif self.preloaded is not None:
            self.preloaded.close()
        while not self.processes.all_reported():
            self.step()
        # Every rank leader is gone; anything still in their groups (a stray child) goes too.
        self.processes.signal_all(signal.SIGKILL)
        ended = end_stragglers(self.node["ranks"])
        if ended:
            self.events.emit(ev=p.STRAGGLERS, count=len(ended), pids=ended)
        self.recorder.send()
        self.events.emit(ev=p.DONE)
        self.events.drain()
        shutil.rmtree(self.scratch, ignore_errors=True)
        return 0

    def cleared(self) -> bool:
        """A gated plan (a job on several hosts): say what would keep this host's ranks from starting, then
        wait for the launcher's go, which comes only once every host is ready, so that a script missing on
        one host starts no rank anywhere. False when told to stop instead (or the launcher went away)."""
        if not self.node.get("gate"):
            return not self.processes.stopping
        self.events.emit(ev=p.READY, problems=self.gate_problems(), plan_at=self.plan_at)
        while not self.go and not self.processes.stopping:
            if self.sel.select(timeout=0.05):
                self.read_commands()
            self.check_heartbeat()
        return not self.processes.stopping

    def gate_problems(self) -> list[dict]:
        """What would keep this host's ranks from starting: a program or module missing, and the like."""
        workdir = self.node.get("workdir") or os.getcwd()
        # the launcher hears no heartbeat while an interpreter is asked about a module: well within its timeout
        timeout = min(MODULE_CHECK_TIMEOUT_S, self.heartbeat.timeout / 3 or MODULE_CHECK_TIMEOUT_S)
        problems, seen = [], set()
        try:
            self.bindings()
        except UsageError as exc:
            problems.append({"kind": "cpu-bind", "name": self.node["cpu_bind"], "error": exc.message, "hint": exc.hint})
        for spec in self.node["ranks"]:
            if tuple(spec["argv"]) not in seen:  # ranks of one node usually run one command
                seen.add(tuple(spec["argv"]))
                problems += start_problems(spec["argv"], workdir, self.rank_env(spec), timeout)
        return problems

    def step(self) -> None:
        """One turn of the loop: commands, rank output, exits, heartbeats, the stop deadline."""
        watch_out = self.events.waiting()
        if watch_out:
            self.sel.register(self.events.fd, selectors.EVENT_WRITE, "out")
        try:
            ready = self.sel.select(timeout=0.05)
        finally:
            if watch_out:
                self.sel.unregister(self.events.fd)
        self.processes.observe_exits()  # before the commands: an exit that came first is stamped as not stopped
        for key, _ in ready:
            if key.data == EXITED:
                continue  # only a wake-up: observe_exits took it
            if key.data is None:
                self.read_commands()
            elif key.data == "out":
                self.events.flush()
            else:
                self.output.read(key.fileobj, *key.data)
        self.reap()
        self.check_heartbeat()
        self.progress.check(self.ranks)
        if self.processes.overdue(time.monotonic()):
            self.processes.signal_all(signal.SIGKILL)


def main() -> int:
    """``python -m distlaunch.agent``: say hello, read the node plan from stdin, supervise its ranks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; a terminal ^C reaches it, not us
    # A closed stdout (the launcher or its SSH channel is gone) must not kill the agent before it has
    # stopped its ranks: writes then fail with EPIPE, which emit() absorbs. Ranks get SIGPIPE back by default.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # "hello" tells a launcher that this host can run the agent before it sends any node its plan,
    # so a host without distlaunch fails the launch before a single rank has started anywhere; and what the
    # host has (its inventory), which the launcher decides from, not from the machine it was typed on.
    try:
        host = inventory()
        hello = p.event(p.HELLO, python=sys.version.split()[0], protocol=p.PROTOCOL, now=time.time(), inventory=host)
        print(json.dumps(hello), flush=True)
    except OSError:
        return 2
    commands = Lines(sys.stdin.fileno())
    line = commands.first()
    plan_at = time.time()
    if not line:
        return 2
    agent = Agent(json.loads(line), commands=commands, plan_at=plan_at, host=host)
    signal.signal(signal.SIGTERM, lambda *_: agent.processes.begin_stop())
    signal.signal(signal.SIGHUP, lambda *_: agent.processes.begin_stop())
    return agent.run()
