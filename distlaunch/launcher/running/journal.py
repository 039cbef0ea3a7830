"""Keeps one job's record current while the job runs. Bookkeeping never fails the job it records."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from distlaunch.contract.report import REQUEUE_CODE, RunReport
from distlaunch.jobs.logs import prune_logs
from distlaunch.jobs.store import STOP_FILE, JobRecord, Owner, free_space, hold_space, job_folder, write_record
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.supervising.ranklogs import logs_folder

log = logging.getLogger("distlaunch")

# How a finished job's exit code reads as a state.
_INTERRUPTED = (129, 130, 143)  # SIGHUP (terminal closed), SIGINT, SIGTERM
# Set aside while the job runs, for its last record: that one adds the report (a failure's last lines per
# failed rank) to the first, so it gets room for the first one twice over.
RESERVE_BYTES = 1 << 20


class Journal:
    """The record of one job: written at start, rewritten when it ends."""

    def __init__(self, record: JobRecord, warn: Callable[[str], None]):
        self.record, self.warn, self.broken = record, warn, False

    @classmethod
    def begin(
        cls, plan: LaunchPlan, backend: str, command: list[str], log_dir: str | None, warn: Callable[[str], None]
    ) -> Journal:
        """Record a job that starts now, owned by this process."""
        record = JobRecord(
            job_id=plan.job_id,
            backend=backend,
            command=command,
            cwd=os.getcwd(),
            hosts=[node.host for node in plan.nodes],
            world_size=plan.world_size,
            owner=Owner.me(),
            log_dir=log_dir,
            rank_logs=str(logs_folder(plan.job_id, None if log_dir is None else Path(log_dir))),
            plan=plan.masked().model_dump(mode="json"),
        )
        journal = cls(record, warn)
        journal._save()
        if not journal.broken:
            hold_space(record.job_id, RESERVE_BYTES + 2 * len(record.model_dump_json()))
            with contextlib.suppress(OSError):  # the store's bound on old logs: never at this job's cost
                prune_logs()
        return journal

    def end(self, report: RunReport | None = None, exit_code: int | None = None, error: str | None = None) -> None:
        """Record how the job ended: from its report, or from the error that ended it before one existed."""
        code = report.exit_code if report is not None else exit_code
        state = "succeeded" if code == 0 else "interrupted" if code in _INTERRUPTED else "failed"
        if state == "interrupted" and (job_folder(self.record.job_id) / STOP_FILE).exists():
            state = "stopped"
        if code == REQUEUE_CODE:  # saved as asked, then stopped: nothing failed
            state = "stopped"
        free_space(self.record.job_id)  # the room set aside at the start: this record lands on a full disk
        self.record = self.record.model_copy(
            update={
                "state": state,
                "exit_code": code,
                "ended_at": time.time(),
                "restarts": report.restarts if report is not None else 0,
                "report": report.model_dump(mode="json") if report is not None else None,
                "attempts": report.attempts if report is not None else self.record.attempts,
                "goodput": report.goodput if report is not None else self.record.goodput,
                "error": error,
            }
        )
        self._save()

    def progress(self, report: RunReport, plan: LaunchPlan) -> None:
        """An attempt ended and the job goes on, on ``plan``: keep what 'distlaunch status' shows of it current."""
        update: dict = {
            "restarts": report.restarts,
            "attempts": report.attempts,
            "goodput": report.goodput,
        }
        update |= {
            "hosts": [node.host for node in plan.nodes],
            "world_size": plan.world_size,
            "plan": plan.masked().model_dump(mode="json"),
        }
        self.record = self.record.model_copy(update=update)
        self._save()

    def replanned(self, plan: LaunchPlan) -> None:
        """The hosts decided before any rank started, and changed the plan (backend, ranks): record the new one."""
        update = {"hosts": [node.host for node in plan.nodes], "world_size": plan.world_size}
        self.record = self.record.model_copy(update={**update, "plan": plan.masked().model_dump(mode="json")})
        self._save()

    def _save(self) -> None:
        if self.broken:
            return
        try:
            write_record(self.record)
        except OSError as exc:
            # A read-only or full state directory costs the job its record, never the job itself.
            self.broken = True
            self.warn(f"cannot record job {self.record.job_id}: {exc} (set DISTLAUNCH_STATE_DIR to a writable folder)")
