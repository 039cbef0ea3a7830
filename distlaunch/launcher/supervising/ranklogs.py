"""Every job's rank logs: one file per rank, ``<job folder>/rank<N>.log``, kept across restarts, read back by
``distlaunch logs``. The job folder is ``<log-dir>/<job id>`` with --log-dir, else the job's own folder in the
job store.

The launcher writes these files itself, from the output the agents forward. A log that reaches --log-max-size is
rotated: it becomes ``rank<N>.log.1`` (replacing the part before) and a new ``rank<N>.log`` starts, so a rank
keeps at most twice that size on disk, its newest lines always. A log that cannot be written (the disk filled
up, a quota, the folder's filesystem went read-only) costs the logs, never the job: hours of training are worth
more than their log files. The first failed write says so once, every log is closed, and the job goes on with
its output still streamed to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from distlaunch.contract.options import DEFAULT_MAX_BYTES
from distlaunch.files import os_error_words
from distlaunch.jobs.logs import RANK_LOG, rank_log_parts
from distlaunch.jobs.store import job_folder
from distlaunch.launcher.planning.plan import LaunchPlan, NodePlan, RankPlan


def logs_folder(job_id: str, log_dir: Path | None) -> Path:
    """Where a job keeps its rank logs, stacks and dumps: <log-dir>/<job id>, else its folder in the job store
    (absolute: the record names it for 'distlaunch logs' run from anywhere)."""
    return Path(log_dir).absolute() / job_id if log_dir is not None else job_folder(job_id)


def made_logs_folder(plan: LaunchPlan, log_dir: Path | None) -> Path:
    """The job's logs folder (see ``logs_folder``), made if need be."""
    folder = logs_folder(plan.job_id, log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def stamp() -> str:
    """UTC time to the millisecond, as every log line starts."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def parse_line(raw: bytes) -> tuple[str, str, str] | None:
    """A rank log's line as (its time stamp, ``out`` or ``err``, the rank's line); None for a ``#`` line (a
    header, a restart's mark) or anything else that is not a rank's line."""
    text = raw.decode("utf-8", "replace").removesuffix("\n")
    when, _, rest = text.partition(" ")
    stream, sep, line = rest.partition("| ")
    if text.startswith("#") or not sep or stream not in ("out", "err"):
        return None
    return when, stream, line


class RankLogs:
    """The rank logs of one job (every attempt); does nothing once a write failed. ``max_bytes``: the size at
    which a rank's log is rotated (0: never)."""

    def __init__(
        self,
        plan: LaunchPlan,
        log_dir: Path | None,
        notice: Callable[[str], None],
        max_bytes: int = DEFAULT_MAX_BYTES,
    ):
        self.plan, self.log_dir, self.notice, self.max_bytes = plan, log_dir, notice, max_bytes
        self.folder: Path | None = None  # the job's folder, once made
        self.open: dict[int, BinaryIO] = {}  # rank -> its log, once it printed in this attempt
        self.sizes: dict[int, int] = {}  # rank -> the size of its open log
        self.marked: set[int] = set()  # ranks whose log has this attempt's header or restart mark
        self.restart_count = 0
        self.failed: str | None = None  # why the logs stopped, once a write failed

    @property
    def on(self) -> bool:
        return self.failed is None

    def begin(self, restart_count: int, plan: LaunchPlan | None = None) -> None:
        """A new attempt (on ``plan``, when it has one of its own: a spare took a host's place, or the job shrank):
        each rank's log gets this restart's mark when the rank starts again."""
        self.restart_count, self.marked = restart_count, set()
        self.plan = plan or self.plan

    def path(self, rank: int) -> Path:
        if self.folder is None:
            self.folder = made_logs_folder(self.plan, self.log_dir)
        return self.folder / RANK_LOG.format(rank=rank)

    def started(self, rank: int, node: NodePlan, spec: RankPlan) -> None:
        """A rank is running: its log gets its header (or this restart's mark) now, whether or not it ever prints."""
        if not self.on or rank in self.marked:
            return
        self.marked.add(rank)
        with self._guard():
            path = self.path(rank)
            new = not path.exists()
            with open(path, "ab") as log:
                if new:
                    log.write(_header(self.plan, node, spec).encode())
                if self.restart_count:
                    log.write(f"# --- restart {self.restart_count}, {stamp()} ---\n".encode())

    def line(self, rank: int, fd: int, text: str, node: NodePlan, spec: RankPlan) -> None:
        """One line of a rank's output, stamped, flushed at once (a killed launcher loses nothing written)."""
        if not self.on:
            return
        self.started(rank, node, spec)  # a rank its agent could not start has no 'started', only its reason
        if not self.on:  # its header could not be written
            return
        # bytes, not text: a line the rank wrote in no valid UTF-8 is kept, marked, never an error
        data = f"{stamp()} {'err' if fd == 2 else 'out'}| {text}\n".encode("utf-8", "replace")
        with self._guard():
            log = self.open.get(rank)
            if log is None:
                # Opened at the first line, not at the start: a rank that never prints holds no descriptor (a
                # job may have thousands). Kept open across lines: reopening per line would cost a syscall storm.
                log = self.open[rank] = open(self.path(rank), "ab")  # noqa: SIM115
                self.sizes[rank] = log.seek(0, os.SEEK_END)
            if self.max_bytes and self.sizes[rank] + len(data) > self.max_bytes:
                log = self.rotate(rank, node, spec)
            log.write(data)
            log.flush()
            self.sizes[rank] += len(data)

    def rotate(self, rank: int, node: NodePlan, spec: RankPlan) -> BinaryIO:
        """The rank's log becomes its previous part (the one before is dropped); a new one starts with the
        header, so that each part says whose lines it holds."""
        self.open.pop(rank).close()
        older, path = rank_log_parts(self.path(rank).parent, rank)
        os.replace(path, older)
        log = self.open[rank] = open(path, "ab")  # noqa: SIM115 - closed by close()
        self.sizes[rank] = log.write(_header(self.plan, node, spec, f"continued from {older.name} at").encode())
        return log

    def close(self) -> None:
        """Close this attempt's open logs (what a full disk kept in a buffer is lost, not raised)."""
        for log in self.open.values():
            with contextlib.suppress(OSError):
                log.close()
        self.open, self.sizes = {}, {}

    @contextlib.contextmanager
    def _guard(self):
        try:
            yield
        except OSError as exc:
            if self.failed is not None:
                return  # said once already
            self.failed = os_error_words(exc)
            where = self.folder or logs_folder(self.plan.job_id, self.log_dir)
            self.notice(
                f"warning: rank logs in {where} cannot be written ({self.failed}): no more rank logs are "
                "written; the job goes on, its output still shown here"
            )
            self.close()


def _header(plan: LaunchPlan, node: NodePlan, spec: RankPlan, event: str = "started") -> str:
    return (
        f"# distlaunch job {plan.job_id}: rank {spec.rank} (local rank {spec.local_rank}) on {node.host}, "
        f"{event} {stamp()}\n# command: {shlex.join(spec.argv)}\n"
        f"# plan: world_size={plan.world_size} nnodes={plan.nnodes} backend={plan.backend} "
        f"parallel={plan.parallel} master={plan.master_addr}:{plan.master_port}\n"
        "# each line: UTC time, stream (out|err), the rank's line\n"
    )
