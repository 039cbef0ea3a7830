"""``distlaunch run``: start a script on every rank (torchrun-compatible environment)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console

from distlaunch import interrupts
from distlaunch.backends.base import LaunchRequest
from distlaunch.backends.registry import select
from distlaunch.cli import groups as g
from distlaunch.cli.output import RankPrinter
from distlaunch.cli.pipes import drop_unread_output, reader_gone
from distlaunch.cli.render import print_json, render_plan, render_report
from distlaunch.contract.plan import Plan
from distlaunch.contract.report import RunReport
from distlaunch.jobs.store import JobRecord
from distlaunch.readable import plural


@g.launch_options(g.PROGRAM, g.LAUNCH_OPTIONS, g.NODE_OPTIONS)
def run(launch: g.LaunchArgs) -> int:
    """Start SCRIPT on every rank of every host, stream their output, stop them all if one fails.

    Each rank gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, NNODES and DISTLAUNCH_JOB_ID, so a script written for torchrun runs unchanged.

    Exit code: 0 on success, 1 for an internal error, 2 for bad input, 3 when a host cannot be reached or goes silent (--heartbeat-timeout), 124 when the job hung (--hang-timeout: every rank's stack is gathered first), the first failing rank's code otherwise (128+N if killed by signal N, 127/126 when its program was not found / could not be executed, 255 when its host's agent was lost), 130/143/129 after Ctrl-C / SIGTERM / a closed terminal (SIGHUP).
    """
    request = launch.request(launch.options())
    return start(request, dry_run=launch.dry_run, json_output=launch.json_output, detach=launch.detach)


def start(
    request: LaunchRequest,
    *,
    dry_run: bool,
    json_output: bool,
    detach: bool,
    refine: Callable[[Plan], Plan] = lambda plan: plan,
    describe: Callable[[Plan, Console], None] = lambda plan, console: None,
    verdict: Callable[[Plan], int] = lambda plan: 0,
    amend: Callable[[RunReport], RunReport] = lambda report: report,
) -> int:
    """The one path of ``run`` and ``train``: pick the backend, plan, then show the plan (--dry-run), hand it to
    a supervisor (--detach), or run it with live rank output and the root-cause table. ``refine`` adds to the
    plan (train: the memory estimate) and ``describe`` shows what it added; ``verdict`` is a dry run's exit code
    (train: 2 when the plan does not fit its devices); ``amend`` adds to the report (train: its --tune trials)."""
    backend = select(request, detach)
    plan = refine(backend.plan(request))
    interrupts.check()  # a signal the planning swallowed (ssh_config, a hostfile's names) ends it here
    if dry_run:
        if json_output:
            print_json(plan.masked())
        else:
            console = Console()
            render_plan(plan, console)
            describe(plan, console)
        return verdict(plan)
    if detach:
        return report_detached(backend.detach(request, plan), json_output)
    # With --json, stdout carries only the report: rank output goes to stderr.
    sink = RankPrinter(multi_host=plan.nnodes > 1, out=sys.stderr if json_output else None, job_id=plan.job_id)
    try:
        report = backend.run(request, plan, sink)
    finally:
        sink.close()  # what the terminal still takes, never waiting on a stalled one
    report = amend(report)
    try:
        render_report(report, Console(stderr=True))
        if json_output:
            print_json(report)
    except (BrokenPipeError, SystemExit) as exc:  # nobody reads the report: the job's exit code still says how it ended
        if not reader_gone(exc):
            raise
        drop_unread_output()
    return report.exit_code


def report_detached(record: JobRecord, json_output: bool) -> int:
    """Print the detached job's id (or its record as JSON) and how to follow it."""
    if json_output:
        print_json(record)
    else:
        print(record.job_id)
        Console(stderr=True).print(
            f"job {record.job_id} runs in the background ({plural(record.world_size, 'rank')}, supervisor pid "
            f"{record.owner.pid}): distlaunch logs {record.job_id} --follow | status | stop",
            highlight=False,
        )
    return 0
