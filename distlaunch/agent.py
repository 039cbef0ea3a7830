"""The per-node agent: ``python -m distlaunch.agent``.

The launcher starts one agent per node (a local subprocess, or a command over SSH) and writes the
node's part of the plan to its stdin as one JSON line. The agent starts the node's ranks, each in
its own process group, reports on stdout and obeys commands on stdin, in the protocol of
distlaunch/protocol.py. When stdin closes (the launcher died, the SSH connection dropped) the agent
stops its ranks by itself, with the grace period capped at 3 s: that is what keeps a SIGKILLed
launcher from leaving ranks behind. Only the process groups this agent created are ever signalled.

Standard library only: it runs on remote hosts with whatever Python they have (3.8+), and it must
start fast.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from distlaunch import protocol as p
from distlaunch.files import lock_folder
from distlaunch.startcheck import MODULE_CHECK_TIMEOUT_S, is_python, program_index, start_problems

_PR_SET_PDEATHSIG = 1
_DRAIN_AFTER_EXIT_S = 1.0  # a rank's grandchild may hold its pipes open: stop waiting for EOF after this
# With the launcher gone nobody waits for a graceful end, and its ranks must be gone within 5 s
# (a dead launcher must not leave a GPU job running): cap the grace period then.
_ORPHAN_GRACE_S = 3.0
# Output lines longer than this travel in pieces, each but the last ending in SPLIT_MARK: the agent's
# and the launcher's memory stay flat whatever a rank prints without a newline.
MAX_LINE_BYTES = 16384
# What may wait for the launcher before the agent stops reading its ranks' pipes (which slows them):
# output is written without ever blocking, so a stalled launcher never keeps the agent from its ranks.
OUT_PENDING_BYTES = 1 << 20
SPLIT_MARK = " [distlaunch: line continues]"
EXITED = "exited"  # the selector's mark for a rank's exit descriptor


# Rank stacks (on a hang, ``--hang-timeout``, or on request, ``distlaunch stacks``): Python ranks start through
# distlaunch/rankboot.py, which arms faulthandler on this signal (a real-time one: no program uses it by
# accident) and a per-rank file in the agent's scratch folder.
STACKS_SIGNAL = signal.SIGRTMIN + 5
STACKS_WAIT_S = 1.0  # faulthandler writes from the signal handler: a second is plenty
STACKS_MAX_BYTES = 256 * 1024
# py-spy dumps run side by side and get this long together: one by one, a py-spy that cannot attach would
# keep the agent from answering heartbeats and outlast the launcher's wait for stacks on a host of 8 ranks
PYSPY_TIMEOUT_S = 10.0
PROGRESS_POLL_S = 1.0
# PyTorch's NCCL watchdog makes a pipe <stem><global rank>.pipe when TORCH_NCCL_DEBUG_INFO_PIPE_FILE names a
# stem, polls it about once a second and dumps its flight recorder when anything is written to it: how a
# hang gets its dumps long before NCCL's own collective timeout would write them.
NCCL_DUMP_PIPE_STEM = "nccl_dump_pipe_rank"
NCCL_DUMP_WAIT_S = 5.0  # for the dumps asked for through the pipes, before the stacks are sent


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def die_with_parent() -> None:
    """In the child: get SIGKILL if the agent dies (a second safety net behind the stdin watch)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the agent already died between fork and prctl
        os._exit(137)


def read_error_file(path: str | None) -> dict | None:
    """The exception a rank's ``@record`` wrote (torch's JSON format): type, message and the traceback's last frame."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            data = json.load(f)
        os.unlink(path)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        text, stack = message, ""
    elif isinstance(message, dict):
        text, stack = str(message.get("message", "")), str((message.get("extraInfo") or {}).get("py_callstack", ""))
    else:
        return None
    kind, sep, rest = text.partition(": ")
    lines = stack.rstrip().splitlines()
    files = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    frame = ""
    if files:
        frame = lines[files[-1]].strip()
        code = lines[files[-1] + 1] if files[-1] + 1 < len(lines) else ""
        if code.startswith("    ") and code.strip().strip("^~ "):
            frame += ": " + code.strip()
    return {"type": kind if sep else "", "message": rest if sep else text, "frame": frame[:500]}


class Rank:
    """One rank process and the bookkeeping for its pipes."""

    def __init__(self, spec: dict, proc: subprocess.Popen):
        self.rank = spec["rank"]
        self.error_file = spec["env"].get("TORCHELASTIC_ERROR_FILE")
        self.proc = proc
        self.pipes = {1: proc.stdout, 2: proc.stderr}  # the ones still open
        self.buffers = {1: b"", 2: b""}
        self.returncode: int | None = None
        self.exited_at = 0.0
        # Wall-clock time the agent saw it end, and whether that came after a stop: the launcher takes the
        # rank that ended first on its own as the root cause, whichever host's report reaches it first.
        self.exit_time = 0.0
        self.stopped = False
        self.exit_fd = _exit_fd(proc.pid)
        self.reported = False


class Agent:
    def __init__(self, node: dict, out=sys.stdout, commands: _Lines | None = None):
        self.node = node
        self.out = out
        self.sel = selectors.DefaultSelector()
        self.ranks: list[Rank] = []
        self.stop_deadline: float | None = None
        self.stopping = False  # told to stop or kill its ranks (or orphaned): later exits are ours, not theirs
        self.go = False  # a gated plan's ranks start only once the launcher says so
        self.stdin_open = True
        self.out_open = True
        self.commands = commands or _Lines(0)
        self.out_fd = _fileno(out)
        self.pending = bytearray()  # events not yet taken by the launcher
        self.paused = False  # rank pipes unregistered while ``pending`` is over its bound
        # Heartbeats: the launcher sends {"cmd": "hb"} and we send {"ev": "hb"}, each every third of the
        # timeout; a launcher silent for the whole timeout is taken for gone and the ranks are stopped.
        self.heartbeat_timeout = float(node.get("heartbeat_timeout") or 0)
        self.heard_at = self.sent_at = time.monotonic()
        self.hang_timeout = float(node.get("hang_timeout") or 0)
        # Every job: stacks can be asked for at any time (distlaunch stacks), not only on a hang.
        self.scratch = make_scratch()
        self.progress_seen = 0.0  # newest progress-file mtime reported
        self.progress_checked = 0.0

    def emit(self, **event) -> None:
        if not self.out_open:
            return
        self.pending += (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        self.sent_at = time.monotonic()
        self.flush_out()

    def flush_out(self) -> None:
        """Write what the launcher's end takes now; never wait (see OUT_PENDING_BYTES)."""
        if self.out_fd is None:  # an in-memory stream
            self.out.write(self.pending.decode("utf-8"))
            self.out.flush()
            self.pending.clear()
            return
        try:
            while self.pending:
                n = os.write(self.out_fd, self.pending)
                del self.pending[:n]
        except BlockingIOError:
            pass
        except OSError:
            self.out_open = False  # the launcher is gone (SSH channel closed): keep going, stop the ranks
            self.pending.clear()
        self.pause_ranks(len(self.pending) > OUT_PENDING_BYTES)

    def pause_ranks(self, pause: bool) -> None:
        """Stop (or resume) reading rank output: a full pipe then slows the rank, not the agent."""
        if pause == self.paused:
            return
        self.paused = pause
        for rank in self.ranks:
            for fd, pipe in rank.pipes.items():
                if pause:
                    self.sel.unregister(pipe)
                else:
                    self.sel.register(pipe, selectors.EVENT_READ, (rank, fd))

    def rank_env(self, spec: dict) -> dict:
        env = dict(os.environ) if self.node.get("inherit_env", True) else _minimal_env()
        env.update(spec["env"])
        env["DISTLAUNCH_RESTART_COUNT"] = env["TORCHELASTIC_RESTART_COUNT"] = str(self.node.get("restart_count", 0))
        env.setdefault("PYTHONUNBUFFERED", "1")  # live logs: ranks' prints reach the launcher as they happen
        base = os.path.join(self.scratch, f"rank{spec['rank']}")
        if is_python(spec["argv"]):
            env["DISTLAUNCH_STACKS_FILE"] = base + ".stacks"
            env["DISTLAUNCH_STACKS_SIGNAL"] = str(int(STACKS_SIGNAL))
        if self.hang_timeout:
            env["DISTLAUNCH_PROGRESS_FILE"] = base + ".progress"
            # PyTorch's NCCL flight recorder (its current names, torch >= 2.6; setting the older aliases too makes
            # every rank print a deprecation warning): recorded collectives, dumped per rank into the scratch
            # folder on a collective timeout. Inert without NCCL.
            env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
            env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
            # The dumps are sent to the launcher at the end (send_nccl_traces), before the scratch folder goes.
            env.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(self.scratch, p.NCCL_TRACE_PREFIX))
            env.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", os.path.join(self.scratch, NCCL_DUMP_PIPE_STEM))
        return env

    def rank_argv(self, spec: dict) -> list[str]:
        """A Python rank starts through rankboot (arms its stack dumps), after the interpreter's own options:
        ``python -u train.py`` runs as ``python -u /…/distlaunch/rankboot.py train.py``. By file path, not
        ``-m``: rankboot is standard library only, so a rank interpreter without distlaunch (--python) works."""
        argv = list(spec["argv"])
        if not is_python(argv):
            return argv
        at, _ = program_index(argv)
        return [*argv[:at], RANKBOOT, *argv[at:]]

    def start(self) -> None:
        workdir = self.node.get("workdir") or None
        for spec in self.node["ranks"]:
            with contextlib.suppress(OSError):  # an earlier attempt's error must not be blamed on this one
                os.unlink(spec["env"].get("TORCHELASTIC_ERROR_FILE") or "")
            try:
                proc = subprocess.Popen(
                    self.rank_argv(spec),
                    env=self.rank_env(spec),
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                self.emit(ev=p.OUT, rank=spec["rank"], fd=2, line=_start_error(spec["argv"][0], exc, workdir))
                self.emit(ev=p.EXIT, rank=spec["rank"], code=_start_exit_code(exc), at=time.time(), stopped=False)
                continue
            rank = Rank(spec, proc)
            self.ranks.append(rank)
            if rank.exit_fd is not None:
                self.sel.register(rank.exit_fd, selectors.EVENT_READ, EXITED)
            for fd, pipe in rank.pipes.items():
                os.set_blocking(pipe.fileno(), False)
                if not self.paused:
                    self.sel.register(pipe, selectors.EVENT_READ, (rank, fd))
            self.emit(ev=p.STARTED, rank=rank.rank, pid=proc.pid)

    def read_pipe(self, pipe, rank: Rank, fd: int) -> None:
        try:
            chunk = pipe.read(65536)
        except BlockingIOError:
            return
        if not chunk:
            self.close_pipe(pipe, rank, fd)
            return
        *lines, rest = (rank.buffers[fd] + chunk).split(b"\n")
        for line in lines:
            self.emit_line(rank, fd, line.rstrip(b"\r"))
        if b"\r" in rest:  # a progress bar redraws its line: show each state now, not at the next newline
            *redraws, rest = rest.split(b"\r")
            for line in redraws:
                if line:
                    self.emit_line(rank, fd, line)
        while len(rest) > MAX_LINE_BYTES:  # a line without end must not grow without bound: split it
            self.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(rest[:MAX_LINE_BYTES]) + SPLIT_MARK)
            rest = rest[MAX_LINE_BYTES:]
        rank.buffers[fd] = rest

    def emit_line(self, rank: Rank, fd: int, line: bytes) -> None:
        """One output line, in pieces of at most MAX_LINE_BYTES (every piece but the last marked)."""
        while len(line) > MAX_LINE_BYTES:
            self.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(line[:MAX_LINE_BYTES]) + SPLIT_MARK)
            line = line[MAX_LINE_BYTES:]
        self.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(line))

    def close_pipe(self, pipe, rank: Rank, fd: int) -> None:
        if rank.buffers[fd]:
            self.emit_line(rank, fd, rank.buffers[fd])
            rank.buffers[fd] = b""
        if not self.paused:
            self.sel.unregister(pipe)
        pipe.close()
        del rank.pipes[fd]

    def read_commands(self) -> None:
        lines = self.commands.read()
        self.heard_at = time.monotonic()
        if lines is None:  # the launcher is gone: nobody will ever tell us to stop, so stop now
            self.stdin_open = False
            self.sel.unregister(self.commands.fd)
            self.begin_stop(_ORPHAN_GRACE_S)
            return
        self.handle(lines)

    def handle(self, lines: list[str]) -> None:
        for line in lines:
            cmd = json.loads(line).get("cmd")
            if cmd == p.STOP:
                self.begin_stop()
            elif cmd == p.KILL:
                self.mark_stopping()
                self.signal_all(signal.SIGKILL)
            elif cmd == p.GO:
                self.go = True
            elif cmd == p.ASK_STACKS:
                self.send_stacks()
            # "hb" needs nothing: any line counts as a sign of life

    def send_stacks(self) -> None:
        """Every running rank's Python stacks: py-spy where installed, else the rank's faulthandler."""
        running = [r for r in self.ranks if r.returncode is None and r.proc.poll() is None]
        armed = {}
        for rank in running:
            path = os.path.join(self.scratch, f"rank{rank.rank}.stacks")
            if os.path.exists(path):
                os.truncate(path, 0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.proc.pid, STACKS_SIGNAL)  # the leader only: its children are not armed
                armed[rank.rank] = path
        asked_at = time.time()
        dumping = self.ask_nccl_dumps(running)
        pyspy = self.start_pyspy(running)
        if armed:
            time.sleep(STACKS_WAIT_S)
        self.wait_nccl_dumps(dumping, asked_at)
        deadline = time.monotonic() + PYSPY_TIMEOUT_S
        for rank in running:
            text, tool = "", "none"
            dump = pyspy.get(rank.rank)
            if dump is not None:
                try:
                    out, _ = dump.communicate(timeout=max(0.0, deadline - time.monotonic()))
                    if dump.returncode == 0:
                        text, tool = _text(out[:STACKS_MAX_BYTES]), "py-spy"
                except subprocess.TimeoutExpired:
                    dump.kill()  # our own child
                    dump.communicate()
            if not text and rank.rank in armed:
                with open(armed[rank.rank], "rb") as f:
                    text, tool = _text(f.read(STACKS_MAX_BYTES)), "faulthandler"
            self.emit(ev=p.STACKS, rank=rank.rank, tool=tool, text=text)

    @staticmethod
    def start_pyspy(running: list[Rank]) -> dict[int, subprocess.Popen]:
        """``py-spy dump`` of every running rank at once, where py-spy is installed."""
        pyspy = shutil.which("py-spy")
        dumps = {}
        for rank in running if pyspy else ():
            with contextlib.suppress(OSError):
                dumps[rank.rank] = subprocess.Popen(
                    # full filenames: shortened, a library's path looks like the user's own
                    [pyspy, "dump", "--full-filenames", "--pid", str(rank.proc.pid)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
        return dumps

    def ask_nccl_dumps(self, running: list[Rank]) -> list[str]:
        """Write to each running rank's NCCL dump pipe (where its watchdog made one); the dump files to expect."""
        expected = []
        for rank in running:
            pipe = os.path.join(self.scratch, f"{NCCL_DUMP_PIPE_STEM}{rank.rank}.pipe")
            try:  # non-blocking: no reader (the watchdog is gone) is ENXIO, never a wait
                fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b"1")
                expected.append(os.path.join(self.scratch, f"{p.NCCL_TRACE_PREFIX}{rank.rank}"))
            os.close(fd)
        return expected

    def wait_nccl_dumps(self, paths: list[str], since: float) -> None:
        """Until every file in ``paths`` was written after ``since`` and stopped growing (NCCL_DUMP_WAIT_S at most):
        the ranks are stopped right after their stacks are in, and a dump cut short cannot be read."""
        deadline, sizes = time.monotonic() + NCCL_DUMP_WAIT_S, {}
        while paths and time.monotonic() < deadline:
            now = {}
            for path in paths:
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    if st.st_mtime >= since - 1:  # mtime granularity
                        now[path] = st.st_size
            if len(now) == len(paths) and now == sizes:
                return
            sizes = now
            time.sleep(0.2)

    def send_nccl_traces(self) -> None:
        """Every NCCL flight recorder dump in the scratch folder, to the launcher (the folder goes next)."""
        try:
            names = sorted(os.listdir(self.scratch))
        except OSError:
            return
        for name in names:
            path = os.path.join(self.scratch, name)
            if not name.startswith(p.NCCL_TRACE_PREFIX) or not os.path.isfile(path):
                continue
            suffix = name[len(p.NCCL_TRACE_PREFIX) :]
            rank = int(suffix) if suffix.isdigit() else None
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    end = min(size, p.NCCL_TRACE_MAX_BYTES)
                    offset = 0
                    while True:  # in pieces, each handed over before the next is read: memory stays flat
                        data = f.read(min(p.NCCL_TRACE_CHUNK_BYTES, end - offset))
                        last = offset + len(data) >= end or not data
                        self.emit(
                            ev=p.NCCL_TRACE,
                            rank=rank,
                            name=name,
                            size=size,
                            offset=offset,
                            data=base64.b64encode(data).decode("ascii"),
                            last=last,
                        )
                        self.drain_out()
                        offset += len(data)
                        if last:
                            break
            except OSError:
                continue

    def check_progress(self) -> None:
        """Report ranks' distlaunch.progress() calls (the mtime of their progress files), once a second."""
        now = time.monotonic()
        if not self.hang_timeout or now - self.progress_checked < PROGRESS_POLL_S:
            return
        self.progress_checked = now
        newest = self.progress_seen
        for rank in self.ranks:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(self.scratch, f"rank{rank.rank}.progress")).st_mtime)
        if newest > self.progress_seen:
            self.progress_seen = newest
            self.emit(ev=p.PROGRESS)

    def check_heartbeat(self) -> None:
        """Send ours when due; stop the ranks when the launcher has been silent for the whole timeout."""
        if not self.heartbeat_timeout:
            return
        now = time.monotonic()
        if now - self.sent_at > self.heartbeat_timeout / 3:
            self.emit(ev=p.HEARTBEAT)
        if self.stdin_open and now - self.heard_at > self.heartbeat_timeout and self.stop_deadline is None:
            self.begin_stop(_ORPHAN_GRACE_S)  # a frozen or cut-off launcher looks like this, not like EOF

    def signal_all(self, sig: int) -> None:
        for rank in self.ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rank.proc.pid, sig)  # the rank's own group: its children go too

    def begin_stop(self, max_grace: float | None = None) -> None:
        grace = float(self.node.get("grace_period", p.GRACE_PERIOD_S))
        deadline = time.monotonic() + (grace if max_grace is None else min(grace, max_grace))
        self.mark_stopping()
        if self.stop_deadline is None:
            self.signal_all(signal.SIGTERM)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline

    def mark_stopping(self) -> None:
        """From now on an exit is one we caused; a rank that ended before this failed on its own."""
        self.observe_exits()
        self.stopping = True

    def observe_exits(self) -> None:
        """Stamp every rank that has ended since the last look."""
        for rank in self.ranks:
            if rank.returncode is not None:
                continue
            rc = rank.proc.poll()
            if rc is None:
                continue
            rank.returncode, rank.exited_at, rank.exit_time = rc, time.monotonic(), time.time()
            rank.stopped = self.stopping
            if rank.exit_fd is not None:
                self.sel.unregister(rank.exit_fd)
                os.close(rank.exit_fd)
                rank.exit_fd = None

    def reap(self) -> None:
        """Report the ranks that ended (step() has stamped them), once their pipes are drained."""
        now = time.monotonic()
        for rank in self.ranks:
            if rank.returncode is not None and not rank.reported:
                if rank.pipes and (self.paused or now - rank.exited_at < _DRAIN_AFTER_EXIT_S):
                    continue  # paused: its last output waits in the pipe until the launcher catches up
                for fd, pipe in list(rank.pipes.items()):
                    self.close_pipe(pipe, rank, fd)
                rank.reported = True
                error = read_error_file(rank.error_file) if rank.returncode else None
                self.emit(
                    ev=p.EXIT,
                    rank=rank.rank,
                    code=rank.returncode,
                    at=rank.exit_time,
                    stopped=rank.stopped,
                    **({"error": error} if error else {}),
                )

    def run(self) -> int:
        self.sel.register(self.commands.fd, selectors.EVENT_READ, None)
        if self.out_fd is not None:
            os.set_blocking(self.out_fd, False)
        self.handle(self.commands.split())  # commands that arrived together with the node plan
        if self.cleared():
            self.start()
        while not all(r.reported for r in self.ranks):
            self.step()
        # Every rank leader is gone; anything still in their groups (a stray child) goes too.
        self.signal_all(signal.SIGKILL)
        ended = self.end_stragglers()
        if ended:
            self.emit(ev=p.STRAGGLERS, count=len(ended), pids=ended)
        self.send_nccl_traces()
        self.emit(ev=p.DONE)
        self.drain_out()
        shutil.rmtree(self.scratch, ignore_errors=True)
        return 0

    def cleared(self) -> bool:
        """A gated plan (a job on several hosts): say what would keep this host's ranks from starting, then
        wait for the launcher's go, which comes only once every host is ready, so that a script missing on
        one host starts no rank anywhere. False when told to stop instead (or the launcher went away)."""
        if not self.node.get("gate"):
            return not self.stopping
        workdir = self.node.get("workdir") or os.getcwd()
        # the launcher hears no heartbeat while an interpreter is asked about a module: well within its timeout
        timeout = min(MODULE_CHECK_TIMEOUT_S, self.heartbeat_timeout / 3 or MODULE_CHECK_TIMEOUT_S)
        problems, seen = [], set()
        for spec in self.node["ranks"]:
            if tuple(spec["argv"]) not in seen:  # ranks of one node usually run one command
                seen.add(tuple(spec["argv"]))
                problems += start_problems(spec["argv"], workdir, self.rank_env(spec), timeout)
        self.emit(ev=p.READY, problems=problems)
        while not self.go and not self.stopping:
            if self.sel.select(timeout=0.05):
                self.read_commands()
            self.check_heartbeat()
        return not self.stopping

    def step(self) -> None:
        """One turn of the loop: commands, rank output, exits, heartbeats, the stop deadline."""
        watch_out = bool(self.pending) and self.out_fd is not None
        if watch_out:
            self.sel.register(self.out_fd, selectors.EVENT_WRITE, "out")
        try:
            ready = self.sel.select(timeout=0.05)
        finally:
            if watch_out:
                self.sel.unregister(self.out_fd)
        self.observe_exits()  # before the commands: an exit that came first is stamped as not stopped
        for key, _ in ready:
            if key.data == EXITED:
                continue  # only a wake-up: observe_exits took it
            if key.data is None:
                self.read_commands()
            elif key.data == "out":
                self.flush_out()
            else:
                self.read_pipe(key.fileobj, *key.data)
        self.reap()
        self.check_heartbeat()
        self.check_progress()
        if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
            self.signal_all(signal.SIGKILL)

    def end_stragglers(self) -> list[int]:
        """End what the ranks left behind outside their process groups (``setsid``, double fork): this
        user's processes whose environment carries this job's id and this node's rank."""
        env = (self.node["ranks"] or [{"env": {}}])[0]["env"]
        if "DISTLAUNCH_JOB_ID" not in env:
            return []
        marks = {f"DISTLAUNCH_JOB_ID={env['DISTLAUNCH_JOB_ID']}".encode(), f"NODE_RANK={env.get('NODE_RANK')}".encode()}
        found = [pid for pid in _pids_with(marks) if pid != os.getpid()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 1.0
            while sig == signal.SIGTERM and time.monotonic() < deadline and any(is_running(pid) for pid in found):
                time.sleep(0.05)
        return found

    def drain_out(self) -> None:
        """Hand the last events to the launcher, while it keeps taking them (never forever)."""
        patience = max(self.heartbeat_timeout, 5.0)
        taken_at = time.monotonic()
        while self.pending and self.out_open and time.monotonic() - taken_at < patience:
            before = len(self.pending)
            select_write(self.out_fd, 0.1)
            self.flush_out()
            if len(self.pending) < before:
                taken_at = time.monotonic()


SCRATCH_PREFIX = "distlaunch-agent-"
SCRATCH_SWEEP_AGE_S = 60.0  # younger folders may be an agent's that is about to lock its own
_held_scratch: list[int] = []  # the descriptor that holds this agent's lock, for as long as it lives


def make_scratch() -> str:
    """This agent's scratch folder, locked (flock) for as long as the agent lives: the kernel drops the lock
    when the agent ends, however it ends. Folders of agents that were killed outright (SIGKILL, the OOM
    killer), which no live agent holds, are removed first, so they do not pile up in the temp folder."""
    sweep_scratch()
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    fd = lock_folder(path)  # young: no sweep takes it before this lock
    if fd is not None:
        _held_scratch.append(fd)
    return path


def sweep_scratch() -> list[str]:
    """Remove this user's abandoned agent scratch folders: older than a minute and locked by no agent."""
    root, removed = tempfile.gettempdir(), []
    try:
        names = [name for name in os.listdir(root) if name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid != os.getuid() or time.time() - info.st_mtime < SCRATCH_SWEEP_AGE_S:
            continue
        fd = lock_folder(path)
        if fd is None:  # a live agent's
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def _exit_fd(pid: int) -> int | None:
    """A descriptor that turns readable when process ``pid`` ends (Linux 5.3+, Python 3.9+), else None.

    The agent's select wakes on it at the exit itself, not at its next poll: when a crash makes a peer rank
    fail a few milliseconds later, the stamps must still put the crash first."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError:
        return None


def _start_error(program: str, exc: OSError, workdir: str | None = None) -> str:
    """Why a rank's program could not start, with the likely fix for a file named without a path (which
    exec looks for on PATH, not in the working directory). A missing working directory fails the same
    exec with the same errno: it is named instead of the program."""
    if workdir and not os.path.isdir(workdir):
        return f"distlaunch: cannot start {program!r}: the working directory {workdir!r} does not exist on this host"
    line = f"distlaunch: cannot start {program!r}: {exc.strerror}"
    if "/" not in program and os.path.isfile(program):
        line += f" (on PATH; the file of that name here is ./{program})"
    return line


def _start_exit_code(exc: OSError) -> int:
    """A shell's exit code for a program it could not run: 126 found but not runnable (no execute
    permission, not a format the kernel runs), 127 not found (or anything else that kept it from starting)."""
    return 126 if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR, errno.ETXTBSY) else 127


RANKBOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rankboot.py")


def _pids_with(marks: set[bytes]) -> list[int]:
    """This user's processes whose environment holds every one of ``marks`` (NAME=VALUE)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marks <= set(f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def is_running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def select_write(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_WRITE)
        sel.select(timeout)


def _fileno(stream) -> int | None:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


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
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:  # stdin shares a non-blocking file description with stdout (a socket)
            return []
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
        hello = p.event(p.HELLO, python=sys.version.split()[0], protocol=p.PROTOCOL, now=time.time())
        print(json.dumps(hello), flush=True)
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
