"""Stopping srun's step in order: SIGTERM to every rank (``scancel --signal=TERM JOB.STEP``), the grace period, then
SIGKILL, in a thread so that srun's output keeps flowing. srun alone would only print the tasks' state on one
Ctrl-C, and SIGKILL every task on SIGTERM. Ranks that save on the save signal get it first after a SIGTERM
(``slurm/savesignal.py``), and the grace period to save and end.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time

from distlaunch.slurm.jobstate import SLURM_CMD_TIMEOUT_S
from distlaunch.slurm.savesignal import STEP_POLL_S, SaveForwarder, scancel

STEP_LOOKUP_S = 10.0  # how long to look for srun's step after a signal (it may still be starting)

_QUEUED = re.compile(r"^srun: job \d+ queued and waiting for resources")
_ALLOCATED = re.compile(r"^srun: job \d+ has been allocated resources")


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


class StepRef:
    """srun's step (``JOB.STEP``), looked up when first needed and kept: the stopper and the save forwarder share it."""

    def __init__(self, srun_pid: int):
        self.srun_pid, self.step = srun_pid, None

    def find(self) -> str | None:
        if self.step is None:
            self.step = find_step(self.srun_pid)
        return self.step


class StepStopper:
    """On the first signal: SIGTERM to every rank of srun's step, the grace period, then SIGKILL (in a thread, so
    srun's output keeps flowing). A second signal skips the rest of the grace period. ``report`` says what was done.

    With ``saver`` (ranks that save on the save signal), a first SIGTERM passes the save signal on first and gives
    the ranks the grace period to save and end; the SIGTERM follows only if they are still running."""

    def __init__(self, proc: subprocess.Popen, grace_period: float, steps: StepRef, saver: SaveForwarder | None = None):
        self.proc, self.grace_period, self.steps, self.saver = proc, grace_period, steps, saver
        self.hurry = threading.Event()
        self.thread: threading.Thread | None = None
        self.done: list[str] = []
        self.queued = False  # srun said its job waits for resources, and not yet that it has them
        self.first: int | None = None

    def heard(self, line: str) -> None:
        """Follow srun's own words about its allocation (``srun: job 42 queued and waiting for resources``)."""
        if _QUEUED.match(line):
            self.queued = True
        elif _ALLOCATED.match(line):
            self.queued = False

    def on_signal(self, signum: int) -> None:
        if self.thread is None:
            self.first = signum
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
            step = self.steps.find()
            if step is None and not self._srun_ended(STEP_POLL_S) and self.hurry.is_set():
                break  # a second signal: no more looking
        if self.proc.poll() is not None:
            self.done.append("srun had already ended")
            return
        if self.queued:
            self.proc.send_signal(signal.SIGTERM)
            self.done.append("srun still waited for its allocation; it was sent SIGTERM, and no rank started")
            return
        save_first = step is not None and self.saver is not None and self.first == signal.SIGTERM
        if save_first and self._save_first(step):
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

    def _save_first(self, step: str) -> bool:
        """The save signal to every rank, then the grace period for them to save and end; True when they did."""
        self.saver.ask(signal.Signals(self.first).name)
        self.done.append(f"sent SIG{self.saver.name} (the save signal) to every rank of step {step} first")
        if self._srun_ended(self.grace_period):
            self.done.append(f"the ranks ended within the {self.grace_period:g} s grace period")
            return True
        why = "a second signal" if self.hurry.is_set() else f"after the {self.grace_period:g} s grace period"
        self.done.append(f"{why}, they still ran")  # a second signal: SIGKILL follows SIGTERM at once
        return False

    def report(self) -> str | None:
        if self.thread is None:
            return None
        self.thread.join(timeout=SLURM_CMD_TIMEOUT_S)
        return "; ".join(self.done) or None
