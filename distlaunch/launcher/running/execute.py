"""``execute(plan)``: a job's attempts, one after another, and its report. Each attempt (``attempt.py``) starts
every rank and supervises them to the end; after one that did not finish, a recovery policy
(``supervising/recovery.py``) decides what comes next."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from distlaunch.contract.options import ExecOptions
from distlaunch.contract.report import HANG_CODE, HOST_SILENT_CODE, RunReport
from distlaunch.contract.sink import Sink
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.running.attempt import Attempt
from distlaunch.launcher.running.context import JobContext
from distlaunch.launcher.running.outcome import AttemptOutcome
from distlaunch.launcher.running.signals import SignalTrap
from distlaunch.launcher.supervising.goodput import account
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
    outcomes: list[AttemptOutcome] = []
    logs = RankLogs(plan, options.log_dir, sink.notice, options.log_max_size)
    step: NextAttempt | None = NextAttempt(plan, connect)
    with SignalTrap() as interrupts:  # first: stop in order; a second ^C: kill at once
        job = JobContext(options, sink, interrupts, logs, requests, stop_request)
        restart_count = 0
        while step is not None:
            logs.begin(restart_count, step.plan)
            outcome = Attempt(job, step, restart_count).run()
            outcomes.append(outcome)
            asked_to_stop = interrupts.first is not None or (stop_request is not None and stop_request.reason)
            asked_to_stop = asked_to_stop or outcome.save_outcome is not None  # saved as asked, then stopped
            if asked_to_stop:
                break
            step = recovery.after(outcome.end, restart_count)
            if progress is not None and step is not None:  # the job goes on: its record says so (the end's own)
                progress(_report(outcomes, interrupts, stop_request, round(time.monotonic() - started, 3)), step.plan)
            restart_count += 1
    return _report(outcomes, interrupts, stop_request, wall_s=round(time.monotonic() - started, 3))


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
    outcomes: list[AttemptOutcome], interrupts: SignalTrap, stop_request: StopRequest | None, wall_s: float
) -> RunReport:
    """The job's report, from its attempts' outcomes in order: how it ended is how its last attempt ended."""
    last = outcomes[-1]
    end = last.end
    failures = end.failures
    # A rank that failed before the signal came is the outcome; the signal only met a job already stopping.
    failed_first = bool(failures) and interrupts.first_at is not None and failures[0].at <= interrupts.first_at
    interrupted = signal.Signals(interrupts.first).name if interrupts.first and not failed_first else None
    exit_code, stopped_by = _exit_code(last, interrupts.first if interrupted else None, stop_request)
    times = [o.times() for o in outcomes]
    return RunReport(
        job_id=end.plan.job_id,
        exit_code=exit_code,
        world_size=end.plan.world_size,
        restarts=len(outcomes) - 1,
        failures=failures,
        interrupted=interrupted,
        stopped_by=stopped_by,
        silent_hosts=end.silent,
        unconfirmed_hosts=last.unconfirmed,
        stragglers=sum(o.stragglers for o in outcomes),
        stragglers_found=[s for o in outcomes for s in o.stragglers_found],
        hang=end.hang,  # how the job ended: a hang a restart recovered from is past
        wall_s=wall_s,
        attempts=[t.report for t in times],
        goodput=account(times, wall_s) if len(outcomes) > 1 or last.steps.last_step is not None else None,
        saved_on_request=[s for o in outcomes for s in o.saved],
        lost_work=lost_work(last.steps) if last.stopped_unsaved else None,
        hosts=end.plan.decisions.inventories if end.plan.decisions is not None else {},
    )


def _exit_code(last: AttemptOutcome, signum: int | None, stop_request: StopRequest | None) -> tuple[int, str | None]:
    """The job's exit code and what stopped it, where no rank's failure did: the signal that ended it (``signum``),
    a stop distlaunch asked for, a save asked with a stop after it, a hang, a silent host, a host taken out of the
    job with nothing to replace it, else the root cause's exit code."""
    end = last.end
    failures = end.failures
    if signum is not None:
        return 128 + signum, None
    if stop_request is not None and stop_request.reason is not None and not failures:
        return stop_request.exit_code, stop_request.reason
    if last.save_outcome is not None and not failures:  # a save asked with a stop after it (or in its place)
        return last.save_outcome
    if end.hang is not None:
        return HANG_CODE, None
    if end.silent:
        return HOST_SILENT_CODE, None
    if end.quarantine and not failures:  # a watch took a host out (a straggler) and nothing could replace it
        return HOST_SILENT_CODE, "; ".join(f"{h}: {why}" for h, why in end.quarantine.items())
    return (failures[0].exit_code if failures else 0), None
