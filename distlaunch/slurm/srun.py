"""Run srun, stream its output, and find the root cause: the first task that failed and its exit code.

With --kill-on-bad-exit srun itself exits 143 (the other tasks were terminated), so the failing rank's code is
read from srun's own report line: ``srun: error: node2: task 2: Exited with exit code 7``.

A SIGINT or SIGTERM to distlaunch stops the step in order (``StepStopper``): srun itself would only print the
tasks' state on one Ctrl-C and SIGKILL every task on SIGTERM, so distlaunch finds srun's step (``scontrol show
steps``: ``SrunHost:Pid``), sends SIGTERM to every rank (``scancel --signal=TERM JOB.STEP``), waits the grace
period, then sends SIGKILL. A second signal sends SIGKILL at once. A distlaunch killed outright (SIGKILL, the OOM
killer) takes srun with it: srun gets SIGTERM when its parent dies, and ends its tasks.

The save signal (``--save-signal``, USR1: Slurm's warning ahead of a time limit) is passed on to every rank
(``slurm/savesignal.py``), which saves a checkpoint and exits 0. A SIGTERM to ranks that save on it (the bundled
engine, or ``--save-signal`` typed) passes it on first and gives them the grace period to save and end; then
SIGTERM and SIGKILL as above. Whether the job is then requeued is ``slurm/requeue.py``'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TextIO

from pydantic import BaseModel

from distlaunch.contract.report import REQUEUE_CODE
from distlaunch.errors import HostError
from distlaunch.launcher.running.signals import SignalTrap, catch
from distlaunch.slurm.jobstate import SLURM_CMD_TIMEOUT_S
from distlaunch.slurm.savesignal import CheckpointForwarder, SaveForwarder
from distlaunch.slurm.stopper import StepRef, StepStopper

PR_SET_PDEATHSIG = 1  # prctl(2)


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
    save_signal: str | None = None  # USR1: every rank's DISTLAUNCH_SAVE_SIGNAL (None: --save-signal none)
    save_asked_by: str | None = None  # what had distlaunch pass it on: the save signal itself, or SIGTERM
    save_sent: str | None = None  # what was done with it, in words
    saved_step: int | None = None  # the step a rank said it saved ("saved the checkpoint of step S")
    saved_by_rank: int | None = None  # the rank that said so (the engine's rank 0)
    saved: bool = False  # asked, a rank said it saved, and every rank then exited 0: it can resume there
    requeued: bool = False  # slurm/requeue.py: Slurm took the requeue
    requeue_error: str | None = None  # slurm/requeue.py: why the job was not requeued, when it was to be


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


class SaveSignal(BaseModel):
    """How ``run_srun`` treats the save signal: its name (USR1), and whether the ranks save on it (then a SIGTERM
    passes it on first)."""

    name: str
    saves_first_on_term: bool = False


def _copy_lines(lines: TextIO, to: TextIO, heard: Callable[[str], None]) -> threading.Thread:
    """Copy srun's stdout to ``to`` line by line in a thread, each line heard on its way (a rank's saved line)."""

    def copy() -> None:
        for line in lines:
            to.write(line)
            to.flush()
            heard(line)

    thread = threading.Thread(target=copy, name="distlaunch-srun-stdout", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _trapped(signal_name: str | None, handler: Callable[[int], None]) -> Iterator[None]:
    """The save signal calls ``handler`` meanwhile (its default action would end distlaunch, and srun with it)."""
    if signal_name is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    sig = signal.Signals[f"SIG{signal_name}"]
    saved = signal.signal(sig, lambda signum, frame: handler(signum))
    try:
        yield
    finally:
        signal.signal(sig, saved)


def run_srun(
    argv: list[str],
    err: TextIO | None = None,
    out: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    grace_period: float = 10.0,
    save: SaveSignal | None = None,
    checkpoint: str | None = None,
) -> SrunResult:
    """Run srun with stdout copied (to ``out``) and stderr echoed line by line while its report lines are read.

    ``save``: the save signal, passed on to every rank when distlaunch gets it (and first on a SIGTERM when the ranks
    save on it); ``env`` then carries it to every rank as DISTLAUNCH_SAVE_SIGNAL (the caller puts it there).
    ``checkpoint``: the signal passed on to every rank as a checkpoint on demand (they save and train on)."""
    err, out = err or sys.stderr, out or sys.stdout
    saver = SaveForwarder(save.name) if save else None
    # trapped from before srun starts: Slurm's warning may come at any moment of the run
    on_demand = CheckpointForwarder(checkpoint) if checkpoint else None
    with (
        _trapped(save.name if save else None, lambda signum: saver.ask(signal.Signals(signum).name)),
        _trapped(checkpoint, lambda signum: on_demand.ask()),
    ):
        proc = _start_srun(argv, env)
        steps = StepRef(proc.pid)
        if on_demand:
            on_demand.attach(steps.find)
        if saver:
            saver.attach(proc, steps.find)
        stopper = StepStopper(proc, grace_period, steps, saver if save and save.saves_first_on_term else None)
        failures, first = _follow(proc, err, out, stopper, saver)
    if saver:
        saver.join()
    return _result(proc.returncode, root_cause(failures), first, stopper, saver)


def _start_srun(argv: list[str], env: Mapping[str, str] | None) -> subprocess.Popen:
    """srun with both streams piped, in its own process group, ended with distlaunch."""
    try:
        # env: the --env values, handed to srun through its environment (never its argv)
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
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


def _follow(
    proc: subprocess.Popen, err: TextIO, out: TextIO, stopper: StepStopper, saver: SaveForwarder | None
) -> tuple[list[TaskFailure], int | None]:
    """Copy srun's output until it ends, reading its report lines; INT, TERM and HUP stop the step meanwhile.
    The failures srun reported, and the first stopping signal (None: none came)."""
    failures: list[TaskFailure] = []
    heard = saver.heard if saver else lambda line: None
    copier = _copy_lines(proc.stdout, out, heard)
    with SignalTrap(stopper.on_signal) as forward, _on_hangup(stopper.on_signal) as hangup:
        for line in proc.stderr:
            err.write(line)
            err.flush()
            stopper.heard(line)
            heard(line)
            failure = parse_failure(line)
            if failure:
                failures.append(failure)
        proc.wait()
        copier.join(timeout=SLURM_CMD_TIMEOUT_S)
    return failures, forward.first or (hangup[0] if hangup else None)


def _result(
    code: int, cause: TaskFailure | None, first: int | None, stopper: StepStopper, saver: SaveForwarder | None
) -> SrunResult:
    """How the step ended. Saved: the ranks were asked, one said it saved, and every one exited 0 (75, or 143
    after a SIGTERM: whether it is requeued is the caller's)."""
    interrupted = signal.Signals(first).name if first else None
    asked = saver is not None and saver.asked_by is not None
    saved = asked and saver.saved is not None and code == 0 and cause is None
    ended = REQUEUE_CODE if saved else cause.exit_code if cause else code
    exit_code = 128 + first if first else ended
    return SrunResult(
        exit_code=exit_code,
        srun_exit_code=code,
        failure=cause,
        interrupted=interrupted,
        stopped=stopper.report(),
        save_signal=saver.name if saver else None,
        save_asked_by=saver.asked_by if asked else None,
        save_sent=saver.words() if asked else None,
        saved_step=saver.saved[1] if saver and saver.saved else None,
        saved_by_rank=saver.saved[0] if saver and saver.saved else None,
        saved=saved,
    )
