"""``execute(plan)``: a job's attempts, one after another, and its report. Each attempt (``attempt.py``) starts
every rank and supervises them to the end; after one that did not finish, a recovery policy
(``supervising/recovery.py``) decides what comes next."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from distlaunch.contract.options import ExecOptions
from distlaunch.contract.report import (
    HANG_CODE,
    HOST_SILENT_CODE,
    AttemptReport,
    RunReport,
)
from distlaunch.contract.sink import Sink
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.running.attempt import Attempt
from distlaunch.launcher.running.signals import SignalTrap
from distlaunch.launcher.supervising.goodput import AttemptTimes, account
from distlaunch.launcher.supervising.liveview import starting_line
from distlaunch.launcher.supervising.ranklogs import RankLogs
from distlaunch.launcher.supervising.recovery import Connect, NextAttempt, Recovery, Restarts
from distlaunch.launcher.supervising.requests import JobRequests, StopRequest
from distlaunch.launcher.supervising.saves import lost_work

# Before the next attempt starts: the report so far, and that attempt's plan
Progress = Callable[[RunReport, LaunchPlan], None]


def execute(
    plan: LaunchPlan,
    options: ExecOptions,
    sink: Sink,
    connect: Connect,
    requests: JobRequests | None = None,
    stop_request: StopRequest | None = None,
    recovery: Recovery | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Run the plan to completion and report how it ended. After an attempt that did not finish, ``recovery``
    decides what comes next (default: the same plan, up to ``max_restarts`` times). ``requests`` (from
    ``launch``) brings what commands ask of the running job (stacks, checkpoints) and the signals it traps;
    ``stop_request`` a stop asked by distlaunch itself; ``progress`` is handed the report so far after each
    attempt (the job record's)."""
    _make_log_dir(options.log_dir)
    sink.notice(starting_line(plan))  # at once: importing torch on every rank takes seconds that look like a hang
    recovery = recovery or Restarts(options.max_restarts, sink.notice)
    started = time.monotonic()
    attempts: list[Attempt] = []
    logs = RankLogs(plan, options.log_dir, sink.notice, options.log_max_size)
    step: NextAttempt | None = NextAttempt(plan, connect)
    with SignalTrap() as interrupts:  # first: stop in order; a second ^C: kill at once
        restart_count = 0
        while step is not None:
            logs.begin(restart_count, step.plan)
            attempt = Attempt(
                step.plan, options, sink, step.connect, restart_count, interrupts, logs, requests, stop_request
            )
            attempt.dropped, attempt.added = step.dropped, step.added
            attempts.append(attempt)
            attempt.run()
            asked_to_stop = interrupts.first is not None or (stop_request is not None and stop_request.reason)
            asked_to_stop = asked_to_stop or attempt.saves.outcome is not None  # saved as asked, then stopped
            if asked_to_stop:
                break
            step = recovery.after(attempt.end(), restart_count)
            if progress is not None and step is not None:  # the job goes on: its record says so (the end's own)
                progress(_report(attempts, interrupts, stop_request, round(time.monotonic() - started, 3)), step.plan)
            restart_count += 1
    return _report(attempts, interrupts, stop_request, wall_s=round(time.monotonic() - started, 3))


def _make_log_dir(log_dir: Path | None) -> None:
    """Make --log-dir before anything starts: a path that cannot be a folder is the user's to fix."""
    if log_dir is None:
        return
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = "is a file" if Path(log_dir).is_file() else f"cannot be created: {exc.strerror}"
        raise UsageError(f"--log-dir {str(log_dir)!r} {what}", "give a folder path that you can write to") from None


def _report(
    attempts: list[Attempt], interrupts: SignalTrap, stop_request: StopRequest | None, wall_s: float
) -> RunReport:
    """How the job ended, as its last attempt ended: a signal, a stop distlaunch asked for, a hang, a silent
    host, a host taken out of the job with nothing to replace it, else the root cause's exit code."""
    last = attempts[-1]
    failures = last.failures
    # A rank that failed before the signal came is the outcome; the signal only met a job already stopping.
    failed_first = bool(failures) and interrupts.first_at is not None and failures[0].at <= interrupts.first_at
    interrupted = signal.Signals(interrupts.first).name if interrupts.first and not failed_first else None
    silent = last.heartbeats.silent
    hang = last.hangs.report  # how the job ended: a hang a restart recovered from is past
    stopped_by = None
    if interrupted:
        exit_code = 128 + interrupts.first
    elif stop_request is not None and stop_request.reason is not None and not failures:
        exit_code, stopped_by = stop_request.exit_code, stop_request.reason
    elif last.saves.outcome is not None and not failures:  # a save asked with a stop after it (or in its place)
        exit_code, stopped_by = last.saves.outcome
    elif hang is not None:
        exit_code = HANG_CODE
    elif silent:
        exit_code = HOST_SILENT_CODE
    elif last.quarantine and not failures:  # a watch took a host out (a straggler) and nothing could replace it
        exit_code, stopped_by = HOST_SILENT_CODE, "; ".join(f"{h}: {why}" for h, why in last.quarantine.items())
    else:
        exit_code = failures[0].exit_code if failures else 0
    times = [_times(a) for a in attempts]
    return RunReport(
        job_id=last.plan.job_id,
        exit_code=exit_code,
        world_size=last.plan.world_size,
        restarts=len(attempts) - 1,
        failures=failures,
        interrupted=interrupted,
        stopped_by=stopped_by,
        silent_hosts=silent,
        unconfirmed_hosts=last.unconfirmed,
        stragglers=sum(a.stragglers for a in attempts),
        stragglers_found=[s for a in attempts for s in a.straggling.found],
        hang=hang,
        wall_s=wall_s,
        attempts=[t.report for t in times],
        goodput=account(times, wall_s) if len(attempts) > 1 or last.steps.last_step is not None else None,
        saved_on_request=[s for a in attempts for s in a.saves.saved],
        lost_work=lost_work(last.steps) if last.saves.stopped_unsaved else None,
    )


def _times(attempt: Attempt) -> AttemptTimes:
    """An attempt as the report lists it, and when its fault happened (the root cause's exit; the last message
    of a host given up; the last progress before a hang)."""
    plan = attempt.plan
    fault_at = None  # a silent host or a hang is detected a timeout after it happened, whatever failed since
    if attempt.heartbeats.silent and attempt.stopped_at is not None:
        fault_at = attempt.stopped_at - max(s.silent_s for s in attempt.heartbeats.silent)
    elif attempt.hangs.report is not None and attempt.stopped_at is not None:
        fault_at = attempt.stopped_at - attempt.hangs.report.timeout_s
    elif attempt.failures:
        fault_at = attempt.failures[0].at
    report = AttemptReport(
        restart=attempt.restart_count,
        hosts=[node.host for node in plan.nodes],
        world_size=plan.world_size,
        layout=str(plan.parallel),
        dropped=attempt.dropped,
        added=attempt.added,
        started_at=attempt.started_at,
        ended_at=attempt.ended_at,
        ended=_ending(attempt),
        first_step=attempt.steps.first_step,
        last_step=attempt.steps.last_step,
    )
    return AttemptTimes(report, attempt.steps, fault_at, attempt.stopped_at)


def _ending(attempt: Attempt) -> str:
    """How an attempt ended, in a few words."""
    if attempt.hangs.report is not None:
        return "hung"
    if attempt.heartbeats.silent:
        return f"{', '.join(s.host for s in attempt.heartbeats.silent)} went silent"
    if attempt.failures:
        return attempt.failures[0].what
    if attempt.quarantine:
        return "; ".join(f"{host}: {why}" for host, why in attempt.quarantine.items())
    if attempt.saves.outcome is not None:  # stopped after a save it was asked for (or for want of one)
        return attempt.saves.outcome[1]
    return "stopped" if attempt.stopped_at is not None else "finished"
