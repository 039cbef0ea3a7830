"""This machine and SSH hosts from a hostfile: one agent per host, driven by a distlaunch launcher process.

The launcher (in a terminal, or a detached job's supervisor) owns the job and keeps its record; ``stop`` signals
it, ``logs`` reads what a detached job printed (or, for a job run in a terminal, its rank logs), ``stacks`` asks it
for every rank's stack.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from distlaunch.backends.base import CheckpointSaved, LaunchRequest, PlanT
from distlaunch.backends.output import FileOutput
from distlaunch.backends.ranklog_lines import rank_log_lines
from distlaunch.contract.sink import Sink
from distlaunch.errors import NoAnswer, UsageError
from distlaunch.jobs.store import (
    ERRORS_FILE,
    LAUNCH_FILE,
    OUTPUT_FILE,
    STOP_FILE,
    JobRecord,
    free_space,
    job_folder,
)
from distlaunch.launcher.supervising.stragglers import read_stragglers

if TYPE_CHECKING:
    from distlaunch.contract.report import RunReport, StacksSnapshot
    from distlaunch.launcher.planning.plan import LaunchPlan


class LauncherDriven(FileOutput[PlanT]):
    """Jobs driven by a distlaunch launcher process on this machine (local and SSH, foreground or detached)."""

    records = ("local", "ssh")

    def current(self, record: JobRecord) -> JobRecord:
        if not record.stragglers_found:  # named by its launcher as it runs, beside the record
            record = record.model_copy(update={"stragglers_found": read_stragglers(job_folder(record.job_id))})
        # "lost": the record says running but its launcher is gone (SIGKILL, reboot); its agents took the ranks.
        if record.state == "running" and record.owner is not None and not record.owner.alive():
            free_space(record.job_id)  # the room its last record would have taken: nobody writes that now
            return record.model_copy(update={"state": "lost"})
        return record

    def request_stop(self, record: JobRecord) -> None:
        owner = record.owner
        if owner is None or owner.hostname != os.uname().nodename:
            where = owner.hostname if owner else "an unknown host"
            raise UsageError(f"job {record.job_id} is supervised on {where}", f"run 'distlaunch stop' on {where}")
        (job_folder(record.job_id) / STOP_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
        if owner.alive():  # pid and start time both match: never a stranger that reused the pid
            os.kill(owner.pid, signal.SIGTERM)  # the launcher stops every rank: SIGTERM, grace period, SIGKILL

    def checkpoint(self, record: JobRecord, then: str, timeout: float) -> CheckpointSaved:
        from distlaunch.launcher.supervising.requests import post_request, wait_answer

        name = post_request(record, "checkpoint", then=then)
        answer = wait_answer(record, name, timeout, "with a checkpoint")
        if not isinstance(answer.get("saved_step"), int):
            raise NoAnswer(
                f"job {record.job_id} saved no checkpoint: {answer.get('error') or 'it did not say why'}",
                f"see 'distlaunch logs {record.job_id}'",
            )
        return CheckpointSaved(job_id=record.job_id, step=answer["saved_step"], save_s=answer.get("save_s"), then=then)

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        return job_folder(record.job_id) / (ERRORS_FILE if stderr else OUTPUT_FILE)

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        """A detached job's output as its terminal would have shown it (with distlaunch's notices and the report);
        a job run in a terminal has only its rank logs."""
        folder = job_folder(record.job_id)
        if os.path.lexists(folder / OUTPUT_FILE) or os.path.lexists(folder / LAUNCH_FILE):
            return super().lines(record, follow, ranks, tail, stderr, on_end)
        return rank_log_lines(record, follow, ranks, tail, stderr, self.reread, on_end)

    def stacks(self, record: JobRecord, timeout: float) -> StacksSnapshot:
        from distlaunch.launcher.supervising.snapshots import request_stacks

        return request_stacks(record, timeout)


def check_probe(request: LaunchRequest) -> None:
    """--probe reads the hosts for a --dry-run: a launch reads them anyway, in its preflight."""
    if request.probe and not request.dry_run:
        raise UsageError(
            "--probe without --dry-run", "add --dry-run to see what the hosts decide without starting a rank"
        )


class Hosts(LauncherDriven["LaunchPlan"]):
    name = "hosts"

    def check(self, request: LaunchRequest, detach: bool) -> None:
        pass  # every option applies; --detach hands the plan to a supervisor

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        from distlaunch.launcher.running.launch import check_shown_local_ranks, plan_for, probed_plan

        check_probe(request)
        plan = plan_for(request.opts, request.exec_opts.workdir, request.exec_opts.flight_recorder)
        if plan.decisions is None and request.probe:
            plan = probed_plan(plan, request.opts, request.exec_opts)
        if plan.decisions is None and request.dry_run and request.opts.nproc_per_node in ("auto", "gpu"):
            raise UsageError(
                f"--nproc-per-node {request.opts.nproc_per_node}: the ranks per host are counted by the hosts' GPUs, "
                "which a --dry-run does not contact",
                "add --probe to read them now, or give the ranks per host, e.g. -n 8",
            )
        check_shown_local_ranks(plan, request.exec_opts.local_ranks_filter)
        return plan

    def run(self, request: LaunchRequest, plan: LaunchPlan, sink: Sink) -> RunReport:
        from distlaunch.launcher.running.launch import launch

        return launch(plan, request.opts, request.exec_opts, sink, command=request.command)

    def detach(self, request: LaunchRequest, plan: LaunchPlan) -> JobRecord:
        from distlaunch.launcher.running.detach import DetachedLaunch, detach
        from distlaunch.launcher.running.launch import check_launch

        check_launch(plan, request.opts)  # what a foreground run checks, before the supervisor starts
        return detach(
            DetachedLaunch(plan=plan, opts=request.opts, exec_opts=request.exec_opts, command=request.command)
        )
