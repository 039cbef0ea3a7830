"""The per-node agent: ``python -m distlaunch.agent``.

The launcher starts one agent per node (a local subprocess, or a command over SSH) and writes the
node's part of the plan to its stdin as one JSON line. The agent starts the node's ranks, each in
its own process group, and reports on stdout, one JSON object per line:

    {"ev": "hello", "python": "3.11.7"}                      (at once, before the node plan is read)
    {"ev": "started", "rank": 3, "pid": 1234}
    {"ev": "out", "rank": 3, "fd": 1, "line": "loss 2.31"}     (whole lines only)
    {"ev": "exit", "rank": 3, "code": 0}                      (negative: killed by that signal)
    {"ev": "done"}

Further stdin lines are commands: {"cmd": "stop"} (SIGTERM, grace period, SIGKILL) or {"cmd": "kill"}.
When stdin closes (the launcher died, the SSH connection dropped) the agent stops its ranks by itself,
with the grace period capped at 3 s: that is what keeps a SIGKILLed launcher from leaving ranks behind. Only the process groups this agent
created are ever signalled.

Standard library only: it runs on remote hosts with whatever Python they have (3.8+), and it must
start fast.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_DRAIN_AFTER_EXIT_S = 1.0  # a rank's grandchild may hold its pipes open: stop waiting for EOF after this
# With the launcher gone nobody waits for a graceful end, and its ranks must be gone within 5 s
# (a dead launcher must not leave a GPU job running): cap the grace period then.
_ORPHAN_GRACE_S = 3.0


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the agent dies (a second safety net behind the stdin watch)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the agent already died between fork and prctl
        os._exit(137)


class Rank:
    """One rank process and the bookkeeping for its pipes."""

    def __init__(self, spec: dict, proc: subprocess.Popen):
        self.rank = spec["rank"]
        self.proc = proc
        self.open_pipes = 2
        self.buffers = {1: b"", 2: b""}
        self.returncode: int | None = None
        self.exited_at = 0.0
        self.reported = False


class Agent:
    def __init__(self, node: dict, out=sys.stdout, commands: "_Lines | None" = None):
        self.node = node
        self.out = out
        self.sel = selectors.DefaultSelector()
        self.ranks: list[Rank] = []
        self.stop_deadline: float | None = None
        self.stdin_open = True
        self.out_open = True
        self.commands = commands or _Lines(0)

    def emit(self, **event) -> None:
        if not self.out_open:
            return
        try:
            self.out.write(json.dumps(event, ensure_ascii=False) + "\n")
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.out_open = False  # the launcher is gone (SSH channel closed): keep going, stop the ranks

    def rank_env(self, spec: dict) -> dict:
        env = dict(os.environ) if self.node.get("inherit_env", True) else _minimal_env()
        env.update(spec["env"])
        env["DISTLAUNCH_RESTART_COUNT"] = str(self.node.get("restart_count", 0))
        env.setdefault("PYTHONUNBUFFERED", "1")  # live logs: ranks' prints reach the launcher as they happen
        return env

    def start(self) -> None:
        workdir = self.node.get("workdir") or None
        for spec in self.node["ranks"]:
            try:
                proc = subprocess.Popen(spec["argv"], env=self.rank_env(spec), cwd=workdir, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                        preexec_fn=_die_with_parent)
            except OSError as exc:
                self.emit(ev="out", rank=spec["rank"], fd=2, line=f"distlaunch: cannot start {spec['argv'][0]!r}: {exc.strerror}")
                self.emit(ev="exit", rank=spec["rank"], code=127)
                continue
            rank = Rank(spec, proc)
            self.ranks.append(rank)
            for fd, pipe in ((1, proc.stdout), (2, proc.stderr)):
                os.set_blocking(pipe.fileno(), False)
                self.sel.register(pipe, selectors.EVENT_READ, (rank, fd))
            self.emit(ev="started", rank=rank.rank, pid=proc.pid)

    def read_pipe(self, pipe, rank: Rank, fd: int) -> None:
        try:
            chunk = pipe.read(65536)
        except BlockingIOError:
            return
        if chunk:
            data = rank.buffers[fd] + chunk
            *lines, rank.buffers[fd] = data.split(b"\n")
            for line in lines:
                self.emit(ev="out", rank=rank.rank, fd=fd, line=line.decode("utf-8", "replace"))
            return
        self.close_pipe(pipe, rank, fd)

    def close_pipe(self, pipe, rank: Rank, fd: int) -> None:
        if rank.buffers[fd]:
            self.emit(ev="out", rank=rank.rank, fd=fd, line=rank.buffers[fd].decode("utf-8", "replace"))
            rank.buffers[fd] = b""
        self.sel.unregister(pipe)
        pipe.close()
        rank.open_pipes -= 1

    def read_commands(self) -> None:
        lines = self.commands.read()
        if lines is None:  # the launcher is gone: nobody will ever tell us to stop, so stop now
            self.stdin_open = False
            self.sel.unregister(self.commands.fd)
            self.begin_stop(_ORPHAN_GRACE_S)
            return
        self.handle(lines)

    def handle(self, lines: list[str]) -> None:
        for line in lines:
            cmd = json.loads(line).get("cmd")
            if cmd == "stop":
                self.begin_stop()
            elif cmd == "kill":
                self.signal_all(signal.SIGKILL)

    def signal_all(self, sig: int) -> None:
        for rank in self.ranks:
            try:
                os.killpg(rank.proc.pid, sig)  # the rank's own group: its children go too
            except (ProcessLookupError, PermissionError):
                pass

    def begin_stop(self, max_grace: float | None = None) -> None:
        grace = float(self.node.get("grace_period", 10.0))
        deadline = time.monotonic() + (grace if max_grace is None else min(grace, max_grace))
        if self.stop_deadline is None:
            self.signal_all(signal.SIGTERM)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline

    def reap(self) -> None:
        now = time.monotonic()
        for rank in self.ranks:
            if rank.returncode is None:
                rc = rank.proc.poll()
                if rc is not None:
                    rank.returncode, rank.exited_at = rc, now
            if rank.returncode is not None and not rank.reported:
                if rank.open_pipes and now - rank.exited_at < _DRAIN_AFTER_EXIT_S:
                    continue
                for key in list(self.sel.get_map().values()):
                    if key.data and key.data[0] is rank:
                        self.close_pipe(key.fileobj, rank, key.data[1])
                rank.reported = True
                self.emit(ev="exit", rank=rank.rank, code=rank.returncode)

    def run(self) -> int:
        self.sel.register(self.commands.fd, selectors.EVENT_READ, None)
        self.start()
        self.handle(self.commands.split())  # commands that arrived together with the node plan
        while not all(r.reported for r in self.ranks):
            for key, _ in self.sel.select(timeout=0.05):
                if key.data is None:
                    self.read_commands()
                else:
                    self.read_pipe(key.fileobj, *key.data)
            self.reap()
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                self.signal_all(signal.SIGKILL)
        # Every rank leader is gone; anything still in their groups (a stray child) goes too.
        self.signal_all(signal.SIGKILL)
        self.emit(ev="done")
        return 0


class _Lines:
    """Whole lines from a raw fd. Unbuffered reads, so that a line that arrived together with another
    is never left in a Python buffer the selector cannot see (a "stop" must never wait for more input)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def first(self) -> str:
        """The first line (blocking until it is complete); empty at end of input."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8")

    def read(self) -> list[str] | None:
        """Read once what is available; the complete lines, or None at end of input."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            return None
        self.buffer += chunk
        return self.split()

    def split(self) -> list[str]:
        """The complete lines in the buffer, taken out of it."""
        *complete, self.buffer = self.buffer.split(b"\n")
        return [c.decode("utf-8") for c in complete if c.strip()]


def _minimal_env() -> dict:
    """What a remote rank inherits from the agent's own login environment when env is not inherited."""
    keep = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")
    return {k: os.environ[k] for k in keep if k in os.environ}


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; a terminal ^C reaches it, not us
    # A closed stdout (the launcher or its SSH channel is gone) must not kill the agent before it has
    # stopped its ranks: writes then fail with EPIPE, which emit() absorbs. Ranks get SIGPIPE back by default.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # "hello" tells a launcher that this host can run the agent before it sends any node its plan,
    # so a host without distlaunch fails the launch before a single rank has started anywhere.
    try:
        print(json.dumps({"ev": "hello", "python": sys.version.split()[0]}), flush=True)
    except OSError:
        return 2
    commands = _Lines(sys.stdin.fileno())
    line = commands.first()
    if not line:
        return 2
    agent = Agent(json.loads(line), commands=commands)
    signal.signal(signal.SIGTERM, lambda *_: agent.begin_stop())
    signal.signal(signal.SIGHUP, lambda *_: agent.begin_stop())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
