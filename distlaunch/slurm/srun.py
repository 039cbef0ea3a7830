"""Run srun, stream its output, and find the root cause: the first task that failed and its exit code.

With --kill-on-bad-exit srun itself exits 143 (the other tasks were terminated), so the failing rank's code is
read from srun's own report line: ``srun: error: node2: task 2: Exited with exit code 7``.

A SIGINT or SIGTERM to distlaunch stops the step in order (``StepStopper``): srun itself would only print the
tasks' state on one Ctrl-C and SIGKILL every task on SIGTERM, so distlaunch finds srun's step (``scontrol show
steps``: ``SrunHost:Pid``), sends SIGTERM to every rank (``scancel --signal=TERM JOB.STEP``), waits the grace
period, then sends SIGKILL. A second signal sends SIGKILL at once. A distlaunch killed outright (SIGKILL, the OOM
killer) takes srun with it: srun gets SIGTERM when its parent dies, and ends its tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TextIO

from pydantic import BaseModel

from distlaunch.errors import HostError
from distlaunch.launcher.signals import SignalTrap, catch
from distlaunch.slurm.jobstate import SLURM_CMD_TIMEOUT_S

PR_SET_PDEATHSIG = 1  # prctl(2)
STEP_LOOKUP_S = 10.0  # how long to look for srun's step after a signal (it may still be starting)
STEP_POLL_S = 0.5  # between two looks (each one asks slurmctld)

_QUEUED = re.compile(r"^srun: job \d+ queued and waiting for resources")
_ALLOCATED = re.compile(r"^srun: job \d+ has been allocated resources")

_REPORT = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<ranks>[\d,\-]+): (?P<what>.+)$")
_EXITED = re.compile(r"Exited with exit code (\d+)")
# srun names a deadly signal by its description (strsignal), e.g. "Killed", "Segmentation fault".
_SIGNALS = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}


class TaskFailure(BaseModel):
    """One rank that srun reported as failed."""

    rank: int
    node: str
    exit_code: int  # 128+N when killed by signal N
    signal: str | None = None
    out_of_memory: bool = False  # srun's "Out Of Memory": the node's OOM killer, or the job's memory limit


class SrunResult(BaseModel):
    """How the step ended: the root-cause rank first, srun's own exit code, and any interruption."""

    exit_code: int
    srun_exit_code: int
    failure: TaskFailure | None = None
    interrupted: str | None = None
    stopped: str | None = None  # after an interruption: what distlaunch did to stop the ranks, as it happened


_STEP = re.compile(r"\bStepId=(?P<step>\d+\.\d+)\b")
_SRUN = re.compile(r"\bSrunHost:Pid=(?P<host>[^:\s]+):(?P<pid>\d+)\b")


def find_step(srun_pid: int, host: str | None = None) -> str | None:
    """``JOB.STEP`` of the step that srun ``srun_pid`` on this host runs, from ``scontrol show steps``."""
    host = (host or socket.gethostname()).split(".")[0]
    try:
        done = subprocess.run(
            ["scontrol", "show", "steps", "-o"], capture_output=True, text=True, timeout=SLURM_CMD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        step, srun = _STEP.search(line), _SRUN.search(line)
        if step and srun and int(srun["pid"]) == srun_pid and srun["host"].split(".")[0] == host:
            return step["step"]
    return None


def scancel(step: str, signal_name: str) -> bool:
    """``scancel --signal=NAME JOB.STEP``; True when scancel accepted it."""
    try:
        done = subprocess.run(
            ["scancel", f"--signal={signal_name}", step], capture_output=True, text=True, timeout=SLURM_CMD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class StepStopper:
    """On the first signal: SIGTERM to every rank of srun's step, the grace period, then SIGKILL (in a thread, so
    srun's output keeps flowing). A second signal skips the rest of the grace period. ``report`` says what was done."""

    def __init__(self, proc: subprocess.Popen, grace_period: float):
        self.proc, self.grace_period = proc, grace_period
        self.hurry = threading.Event()
        self.thread: threading.Thread | None = None
        self.done: list[str] = []
        self.queued = False  # srun said its job waits for resources, and not yet that it has them

    def heard(self, line: str) -> None:
        """Follow srun's own words about its allocation (``srun: job 42 queued and waiting for resources``)."""
        if _QUEUED.match(line):
            self.queued = True
        elif _ALLOCATED.match(line):
            self.queued = False

    def on_signal(self, signum: int) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._stop, name="distlaunch-step-stopper", daemon=True)
            self.thread.start()
        else:
            self.hurry.set()

    def _srun_ended(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None:
            if self.hurry.is_set() or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _stop(self) -> None:
        step = None
        deadline = time.monotonic() + STEP_LOOKUP_S
        # No step while the job waits for its allocation: srun withdraws the request on SIGTERM, at once.
        while not self.queued and step is None and self.proc.poll() is None and time.monotonic() < deadline:
            step = find_step(self.proc.pid)
            if step is None and not self._srun_ended(STEP_POLL_S) and self.hurry.is_set():
                break  # a second signal: no more looking
        if self.proc.poll() is not None:
            self.done.append("srun had already ended")
            return
        if self.queued:
            self.proc.send_signal(signal.SIGTERM)
            self.done.append("srun still waited for its allocation; it was sent SIGTERM, and no rank started")
            return
        if step is None or not scancel(step, "TERM"):
            # no step (not started yet), or Slurm refused: srun's own stop is all there is
            self.proc.send_signal(signal.SIGTERM)
            why = "no running step of this srun was found" if step is None else f"scancel refused to signal step {step}"
            self.done.append(f"{why}; srun was sent SIGTERM (it SIGKILLs its tasks)")
            return
        self.done.append(f"sent SIGTERM to every rank of step {step}")
        if self._srun_ended(self.grace_period):
            self.done.append(f"the ranks ended within the {self.grace_period:g} s grace period")
            return
        why = "a second signal" if self.hurry.is_set() else f"after the {self.grace_period:g} s grace period"
        sent = scancel(step, "KILL")
        self.done.append(f"{why}, sent SIGKILL" if sent else f"{why}, scancel --signal=KILL {step} failed")

    def report(self) -> str | None:
        if self.thread is None:
            return None
        self.thread.join(timeout=SLURM_CMD_TIMEOUT_S)
        return "; ".join(self.done) or None


def parse_failure(line: str) -> TaskFailure | None:
    """A TaskFailure from one of srun's ``task N: ...`` report lines, or None for any other line."""
    match = _REPORT.match(line.rstrip("\n"))
    if not match:
        return None
    rank, node, what = int(re.split(r"[,-]", match["ranks"])[0]), match["node"], match["what"]
    exited = _EXITED.search(what)
    if exited:
        code = int(exited.group(1))
        return TaskFailure(rank=rank, node=node, exit_code=code) if code else None
    for text, sig in _SIGNALS.items():
        if what.startswith(text):
            return TaskFailure(rank=rank, node=node, exit_code=128 + sig, signal=sig.name)
    if what.startswith("Out Of Memory"):  # killed (SIGKILL) for memory
        return TaskFailure(rank=rank, node=node, exit_code=128 + signal.SIGKILL, signal="SIGKILL", out_of_memory=True)
    return None


def root_cause(failures: list[TaskFailure]) -> TaskFailure | None:
    """The first failure that is not a SIGTERM: --kill-on-bad-exit terminates the others after the root cause."""
    for failure in failures:
        if failure.signal != "SIGTERM":
            return failure
    return failures[0] if failures else None


@contextlib.contextmanager
def _on_hangup(handler: Callable[[int], None]) -> Iterator[list[int]]:
    """A lost terminal (SIGHUP) stops the step like SIGTERM: srun, in its own process group, would not see it.
    Yields a list that holds SIGHUP once it arrived."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def on_hup(signum, frame) -> None:
        got.append(signum)
        handler(signum)

    saved = catch(signal.SIGHUP, on_hup)
    try:
        yield got
    finally:
        if saved is not None:
            signal.signal(signal.SIGHUP, saved)


def _ended_with_parent() -> Callable[[], None] | None:
    """What srun's child runs before exec so that it gets SIGTERM when distlaunch dies, however it dies
    (Linux's parent-death signal): srun, in its own process group, would otherwise run on with every rank,
    and SIGTERM makes srun end its tasks. None where there is no prctl. Called from the thread that runs srun
    to its end (the signal follows the thread that forked it); resolved here, as the child may not import."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # distlaunch died before the line above: nobody else will stop srun
            os._exit(1)

    return in_child


def run_srun(
    argv: list[str],
    err: TextIO | None = None,
    out: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    grace_period: float = 10.0,
) -> SrunResult:
    """Run srun with stdout passed through (to ``out``) and stderr echoed line by line while its report lines are read."""
    err = err or sys.stderr
    try:
        # env: the --env values, handed to srun through its environment (never its argv)
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env={**os.environ, **(env or {})},
            # its own process group: a terminal's Ctrl-C reaches distlaunch alone, which stops the step in order
            # (srun would take one Ctrl-C as "print the tasks' state"); no terminal input, so no SIGTTIN
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=_ended_with_parent(),
        )
    except FileNotFoundError:
        raise HostError(
            f"{argv[0]!r} not found: Slurm's client commands are not installed here",
            "run on a Slurm login node, or install slurm-client",
        ) from None
    failures: list[TaskFailure] = []

    stopper = StepStopper(proc, grace_period)
    with SignalTrap(stopper.on_signal) as forward, _on_hangup(stopper.on_signal) as hangup:
        for line in proc.stderr:
            err.write(line)
            err.flush()
            stopper.heard(line)
            failure = parse_failure(line)
            if failure:
                failures.append(failure)
        code = proc.wait()
    cause = root_cause(failures)
    first = forward.first or (hangup[0] if hangup else None)
    interrupted = signal.Signals(first).name if first else None
    exit_code = 128 + first if first else (cause.exit_code if cause else code)
    return SrunResult(
        exit_code=exit_code, srun_exit_code=code, failure=cause, interrupted=interrupted, stopped=stopper.report()
    )
