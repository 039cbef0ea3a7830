"""What a hung or stuck job leaves to read: every running rank's Python stacks (on a hang, ``--hang-timeout``,
or on request, ``distlaunch stacks``), and PyTorch's NCCL flight-recorder dumps, which go to the launcher at
the agent's end."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import time

from distlaunch import protocol as p
from distlaunch.agent.channel import Events
from distlaunch.agent.rankenv import NCCL_DUMP_PIPE_STEM, STACKS_SIGNAL
from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import STACKS, rank_file

STACKS_WAIT_S = 1.0  # faulthandler writes from the signal handler: a second is plenty
STACKS_MAX_BYTES = 256 * 1024
# py-spy dumps run side by side and get this long together: one by one, a py-spy that cannot attach would
# keep the agent from answering heartbeats and outlast the launcher's wait for stacks on a host of 8 ranks
PYSPY_TIMEOUT_S = 10.0
NCCL_DUMP_WAIT_S = 5.0  # for the dumps asked for through the pipes, before the stacks are sent


class FlightRecorder:
    """PyTorch's NCCL flight recorder, for the ranks of a job with a hang watch (``enabled``): where it dumps,
    how a dump is asked for now, and the dumps' way to the launcher."""

    def __init__(self, scratch: str, enabled: bool, events: Events):
        self.scratch = scratch
        self.enabled = enabled
        self.events = events

    def ask(self, running: list[Rank]) -> list[str]:
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

    @staticmethod
    def wait(paths: list[str], since: float) -> None:
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

    def send(self) -> None:
        """Every NCCL flight recorder dump in the scratch folder, to the launcher (the folder goes next)."""
        try:
            names = sorted(os.listdir(self.scratch))
        except OSError:
            return
        for name in names:
            path = os.path.join(self.scratch, name)
            if not name.startswith(p.NCCL_TRACE_PREFIX) or not os.path.isfile(path):
                continue
            with contextlib.suppress(OSError):
                self.send_file(path, name)

    def send_file(self, path: str, name: str) -> None:
        """One dump, in pieces, each handed over before the next is read: memory stays flat."""
        suffix = name[len(p.NCCL_TRACE_PREFIX) :]
        rank = int(suffix) if suffix.isdigit() else None
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            end = min(size, p.NCCL_TRACE_MAX_BYTES)
            offset = 0
            while True:
                data = f.read(min(p.NCCL_TRACE_CHUNK_BYTES, end - offset))
                last = offset + len(data) >= end or not data
                self.events.emit(
                    ev=p.NCCL_TRACE,
                    rank=rank,
                    name=name,
                    size=size,
                    offset=offset,
                    data=base64.b64encode(data).decode("ascii"),
                    last=last,
                )
                self.events.drain()
                offset += len(data)
                if last:
                    break


class Stacks:
    """Every running rank's Python stacks, on request: py-spy where installed, else the rank's faulthandler.
    The flight recorder is asked for its dumps at the same moment, so that both show the same state."""

    def __init__(self, scratch: str, events: Events, recorder: FlightRecorder):
        self.scratch = scratch
        self.events = events
        self.recorder = recorder

    def send(self, ranks: list[Rank]) -> None:
        """Every running rank's Python stacks: py-spy where installed, else the rank's faulthandler."""
        running = [r for r in ranks if r.returncode is None and r.proc.poll() is None]
        armed = self.signal_faulthandlers(running)
        asked_at = time.time()
        dumping = self.recorder.ask(running)
        pyspy = start_pyspy(running)
        if armed:
            time.sleep(STACKS_WAIT_S)
        self.recorder.wait(dumping, asked_at)
        deadline = time.monotonic() + PYSPY_TIMEOUT_S
        for rank in running:
            text, tool = _pyspy_result(pyspy.get(rank.rank), deadline)
            if not text and rank.rank in armed:
                with open(armed[rank.rank], "rb") as f:
                    text, tool = _text(f.read(STACKS_MAX_BYTES)), "faulthandler"
            self.events.emit(ev=p.STACKS, rank=rank.rank, tool=tool, text=text)

    def signal_faulthandlers(self, running: list[Rank]) -> dict[int, str]:
        """Empty each armed rank's stacks file and signal the rank to write it; those files, by rank."""
        armed = {}
        for rank in running:
            path = rank_file(self.scratch, rank.rank, STACKS)
            if os.path.exists(path):
                os.truncate(path, 0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rank.proc.pid, STACKS_SIGNAL)  # the leader only: its children are not armed
                armed[rank.rank] = path
        return armed


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


def _pyspy_result(dump: subprocess.Popen | None, deadline: float) -> tuple[str, str]:
    """A py-spy dump's text and tool ("py-spy"), once it ends (by ``deadline``); ("", "none") without one."""
    if dump is None:
        return "", "none"
    try:
        out, _ = dump.communicate(timeout=max(0.0, deadline - time.monotonic()))
        if dump.returncode == 0:
            return _text(out[:STACKS_MAX_BYTES]), "py-spy"
    except subprocess.TimeoutExpired:
        dump.kill()  # our own child
        dump.communicate()
    return "", "none"


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
