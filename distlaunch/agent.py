"""The per-node agent: ``python -m distlaunch.agent``.

The launcher starts one agent per node (a local subprocess, or a command over SSH) and writes the
node's part of the plan to its stdin as one JSON line. The agent starts the node's ranks, each in
its own process group, and reports on stdout, one JSON object per line:

    {"ev": "started", "rank": 3, "pid": 1234}
    {"ev": "out", "rank": 3, "fd": 1, "line": "loss 2.31"}     (whole lines only)
    {"ev": "exit", "rank": 3, "code": 0}                      (negative: killed by that signal)
    {"ev": "done"}

Further stdin lines are commands: {"cmd": "stop"} (SIGTERM, grace period, SIGKILL) or {"cmd": "kill"}.
When stdin closes (the launcher died, the SSH connection dropped) the agent stops its ranks by itself:
that is what keeps a SIGKILLed launcher from leaving ranks behind. Only the process groups this agent
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
    def __init__(self, node: dict, out=sys.stdout):
        self.node = node
        self.out = out
        self.sel = selectors.DefaultSelector()
        self.ranks: list[Rank] = []
        self.stop_deadline: float | None = None
        self.stdin_open = True

    def emit(self, **event) -> None:
        self.out.write(json.dumps(event, ensure_ascii=False) + "\n")
        self.out.flush()

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

    def read_command(self) -> None:
        line = sys.stdin.readline()
        if not line:  # the launcher is gone: nobody will ever tell us to stop, so stop now
            self.stdin_open = False
            self.sel.unregister(sys.stdin)
            self.begin_stop()
            return
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

    def begin_stop(self) -> None:
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + float(self.node.get("grace_period", 10.0))
            self.signal_all(signal.SIGTERM)

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
        self.sel.register(sys.stdin, selectors.EVENT_READ, None)
        self.start()
        while not all(r.reported for r in self.ranks):
            for key, _ in self.sel.select(timeout=0.05):
                if key.data is None:
                    self.read_command()
                else:
                    self.read_pipe(key.fileobj, *key.data)
            self.reap()
            if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                self.signal_all(signal.SIGKILL)
        # Every rank leader is gone; anything still in their groups (a stray child) goes too.
        self.signal_all(signal.SIGKILL)
        self.emit(ev="done")
        return 0


def _minimal_env() -> dict:
    """What a remote rank inherits from the agent's own login environment when env is not inherited."""
    keep = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")
    return {k: os.environ[k] for k in keep if k in os.environ}


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; a terminal ^C reaches it, not us
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    line = sys.stdin.readline()
    if not line:
        return 2
    agent = Agent(json.loads(line))
    signal.signal(signal.SIGTERM, lambda *_: agent.begin_stop())
    signal.signal(signal.SIGHUP, lambda *_: agent.begin_stop())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
