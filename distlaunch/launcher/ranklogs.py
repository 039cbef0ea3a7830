"""``--log-dir``: one log file per rank, ``<log-dir>/<job id>/rank<N>.log``, kept across restarts.

The launcher writes these files itself, from the output the agents forward. A log that cannot be written (the
disk filled up, a quota, the folder's filesystem went read-only) costs the logs, never the job: hours of
training are worth more than their log files. The first failed write says so once, every log is closed, and the
job goes on with its output still streamed to the terminal.
"""

from __future__ import annotations

import contextlib
import shlex
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from distlaunch.files import os_error_words
from distlaunch.launcher.plan import LaunchPlan, NodePlan, RankPlan


def job_folder(plan: LaunchPlan, log_dir: Path | None) -> Path:
    """The job's own folder: <log-dir>/<job id>, or a private temporary one without --log-dir."""
    if log_dir is not None:
        folder = Path(log_dir) / plan.job_id
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return Path(tempfile.mkdtemp(prefix=f"distlaunch-{plan.job_id}-"))


def stamp() -> str:
    """UTC time to the millisecond, as every log line starts."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


class RankLogs:
    """The rank logs of one job (every attempt); does nothing without --log-dir or once a write failed."""

    def __init__(self, plan: LaunchPlan, log_dir: Path | None, notice: Callable[[str], None]):
        self.plan, self.log_dir, self.notice = plan, log_dir, notice
        self.folder: Path | None = None  # <log-dir>/<job id>, once made
        self.open: dict[int, TextIO] = {}  # rank -> its log, once it printed in this attempt
        self.marked: set[int] = set()  # ranks whose log has this attempt's header or restart mark
        self.restart_count = 0
        self.failed: str | None = None  # why the logs stopped, once a write failed

    @property
    def on(self) -> bool:
        return self.log_dir is not None and self.failed is None

    def begin(self, restart_count: int, plan: LaunchPlan | None = None) -> None:
        """A new attempt (on ``plan``, when it has one of its own: a spare took a host's place, or the job shrank):
        each rank's log gets this restart's mark when the rank starts again."""
        self.restart_count, self.marked = restart_count, set()
        self.plan = plan or self.plan

    def path(self, rank: int) -> Path:
        if self.folder is None:
            self.folder = job_folder(self.plan, self.log_dir)
        return self.folder / f"rank{rank}.log"

    def started(self, rank: int, node: NodePlan, spec: RankPlan) -> None:
        """A rank is running: its log gets its header (or this restart's mark) now, whether or not it ever prints."""
        if not self.on or rank in self.marked:
            return
        self.marked.add(rank)
        with self._guard():
            path = self.path(rank)
            new = not path.exists()
            with open(path, "a", encoding="utf-8") as log:
                if new:
                    log.write(_header(self.plan, node, spec))
                if self.restart_count:
                    log.write(f"# --- restart {self.restart_count}, {stamp()} ---\n")

    def line(self, rank: int, fd: int, text: str, node: NodePlan, spec: RankPlan) -> None:
        """One line of a rank's output, stamped, flushed at once (a killed launcher loses nothing written)."""
        if not self.on:
            return
        self.started(rank, node, spec)  # a rank its agent could not start has no 'started', only its reason
        if not self.on:  # its header could not be written
            return
        with self._guard():
            log = self.open.get(rank)
            if log is None:
                # Opened at the first line, not at the start: a rank that never prints holds no descriptor (a
                # job may have thousands). Kept open across lines: reopening per line would cost a syscall storm.
                log = self.open[rank] = open(self.path(rank), "a", encoding="utf-8")  # noqa: SIM115
            log.write(f"{stamp()} {'err' if fd == 2 else 'out'}| {text}\n")
            log.flush()

    def close(self) -> None:
        """Close this attempt's open logs (what a full disk kept in a buffer is lost, not raised)."""
        for log in self.open.values():
            with contextlib.suppress(OSError):
                log.close()
        self.open = {}

    @contextlib.contextmanager
    def _guard(self):
        try:
            yield
        except OSError as exc:
            if self.failed is not None:
                return  # said once already
            self.failed = os_error_words(exc)
            where = self.folder or Path(self.log_dir or "")
            self.notice(
                f"warning: rank logs in {where} cannot be written ({self.failed}): no more rank logs are "
                "written; the job goes on, its output still shown here"
            )
            self.close()


def _header(plan: LaunchPlan, node: NodePlan, spec: RankPlan) -> str:
    return (
        f"# distlaunch job {plan.job_id}: rank {spec.rank} (local rank {spec.local_rank}) on {node.host}, "
        f"started {stamp()}\n# command: {shlex.join(spec.argv)}\n"
        f"# plan: world_size={plan.world_size} nnodes={plan.nnodes} backend={plan.backend} "
        f"parallel={plan.parallel} master={plan.master_addr}:{plan.master_port}\n"
        "# each line: UTC time, stream (out|err), the rank's line\n"
    )
