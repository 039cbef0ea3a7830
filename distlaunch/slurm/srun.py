"""Run srun, stream its output, and find the root cause: the first task that failed and its exit code.

With --kill-on-bad-exit srun itself exits 143 (the other tasks were terminated), so the failing rank's code is
read from srun's own report line: ``srun: error: node2: task 2: Exited with exit code 7``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from typing import TextIO

from pydantic import BaseModel

from distlaunch.errors import HostError
from distlaunch.launcher.signals import SignalTrap

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


class SrunResult(BaseModel):
    """How the step ended: the root-cause rank first, srun's own exit code, and any interruption."""

    exit_code: int
    srun_exit_code: int
    failure: TaskFailure | None = None
    interrupted: str | None = None


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
    return None


def root_cause(failures: list[TaskFailure]) -> TaskFailure | None:
    """The first failure that is not a SIGTERM: --kill-on-bad-exit terminates the others after the root cause."""
    for failure in failures:
        if failure.signal != "SIGTERM":
            return failure
    return failures[0] if failures else None


def run_srun(argv: list[str], err: TextIO | None = None, out: TextIO | None = None) -> SrunResult:
    """Run srun with stdout passed through (to ``out``) and stderr echoed line by line while its report lines are read."""
    err = err or sys.stderr
    try:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    except FileNotFoundError:
        raise HostError(f"{argv[0]!r} not found: Slurm's client commands are not installed here",
                        "run on a Slurm login node, or install slurm-client") from None
    failures: list[TaskFailure] = []
    def forward_to_srun(signum: int) -> None:  # a second ^C makes srun itself kill the step
        if proc.poll() is None:
            proc.send_signal(signum)

    with SignalTrap(forward_to_srun) as forward:
        for line in proc.stderr:
            err.write(line)
            err.flush()
            failure = parse_failure(line)
            if failure:
                failures.append(failure)
        code = proc.wait()
    cause = root_cause(failures)
    interrupted = signal.Signals(forward.first).name if forward.first else None
    exit_code = 128 + forward.first if forward.first else (cause.exit_code if cause else code)
    return SrunResult(exit_code=exit_code, srun_exit_code=code, failure=cause, interrupted=interrupted)
