"""The save signal under srun: ``distlaunch slurm run`` passes it on to every rank of its step.

Every rank has ``DISTLAUNCH_SAVE_SIGNAL`` (USR1 by default) in its environment. The bundled engine traps that
signal from its start (a script of your own through ``distlaunch.checkpoint_requested()``); on it the ranks agree
on a step, save its checkpoint, rank 0 prints ``saved the checkpoint of step S``, and every rank exits 0. Until a
rank traps it the signal is ignored (``slurm/task.py`` sets it so before the exec): a rank still importing torch
must not die of it, nor a program that never looks at it.

So a signal that comes while the ranks still start is lost: it is sent again every ``RESEND_S`` while srun runs
and no rank has said it saved (for ``RESEND_FOR_S`` at most). Sending it twice asks for one save: a rank keeps one
request until its save answers it.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable

from distlaunch.slurm.jobstate import SLURM_CMD_TIMEOUT_S

STEP_POLL_S = 0.5  # between two looks for srun's step while it may still be starting
RESEND_S = 5.0  # between two sends while no rank has said it saved
RESEND_FOR_S = 600.0  # the longest a rank may take to trap it: importing torch, joining the process group
_SAVED = re.compile(r"^\s*(?P<rank>\d+): saved the checkpoint of step (?P<step>\d+)\b")  # srun --label's "N: "


def scancel(step: str, signal_name: str) -> bool:
    """``scancel --signal=NAME JOB.STEP``; True when scancel accepted it."""
    try:
        done = subprocess.run(
            ["scancel", f"--signal={signal_name}", step], capture_output=True, text=True, timeout=SLURM_CMD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def saved_step(line: str) -> tuple[int, int] | None:
    """(rank, step) from a rank's ``saved the checkpoint of step S`` line as srun --label prints it, else None."""
    match = _SAVED.match(line)
    return (int(match["rank"]), int(match["step"])) if match else None


class SaveForwarder:
    """Passes the save signal on to every rank of srun's step, again while none has said it saved (in a thread, so
    srun's output keeps flowing). ``asked_by`` says what asked: the save signal itself, or a SIGTERM."""

    def __init__(self, signal_name: str):
        self.name = signal_name
        self.proc: subprocess.Popen | None = None  # srun, once started (attach)
        self.find_step: Callable[[], str | None] = lambda: None
        self.asked_by: str | None = None  # "SIGUSR1" (the save signal), "SIGTERM"
        self.saved: tuple[int, int] | None = None  # (rank, step) of the first "saved the checkpoint" line
        self.step: str | None = None  # JOB.STEP it was sent to
        self.sends = 0
        self.thread: threading.Thread | None = None

    def heard(self, line: str) -> None:
        """A line of the ranks' output: the first that says a checkpoint was saved ends the sending."""
        if self.saved is None and self.asked_by is not None:  # not a save before it (a checkpoint on demand)
            self.saved = saved_step(line)

    def ask(self, why: str) -> None:
        """Ask every rank for a save (``why``: SIGUSR1, SIGTERM); a second ask changes nothing. Asked before srun
        started, the sending starts with it."""
        if self.asked_by is None:
            self.asked_by = why
        self._start()

    def attach(self, proc: subprocess.Popen, find_step: Callable[[], str | None]) -> None:
        """srun is running (``find_step``: its ``JOB.STEP``, once there is one): send what was asked meanwhile."""
        self.proc, self.find_step = proc, find_step
        self._start()

    def _start(self) -> None:
        if self.thread is None and self.proc is not None and self.asked_by is not None:
            self.thread = threading.Thread(target=self._send, name="distlaunch-save-signal", daemon=True)
            self.thread.start()

    def _send(self) -> None:
        started = time.monotonic()
        while self.proc.poll() is None and self.saved is None and time.monotonic() - started < RESEND_FOR_S:
            step = self.find_step()
            if step is not None and scancel(step, self.name):
                self.step, self.sends = step, self.sends + 1
            self._wait(RESEND_S if self.sends else STEP_POLL_S)

    def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and self.saved is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=SLURM_CMD_TIMEOUT_S)

    def words(self) -> str:
        """What was done, for the report: ``sent SIGUSR1 to every rank of step 12.0; rank 0 saved ... step 41``."""
        sent = (
            f"sent SIG{self.name} to every rank of step {self.step}"
            if self.step
            else f"found no running step to send SIG{self.name} to"
        )
        if self.saved is None:
            return f"{sent}; no rank said it saved a checkpoint"
        return f"{sent}; rank {self.saved[0]} saved the checkpoint of step {self.saved[1]}"


class CheckpointForwarder:
    """The checkpoint signal (``distlaunch checkpoint slurm-N``: save, and train on), passed on once to every rank of
    srun's step, in a thread. One that comes before the ranks run is dropped: there is nothing to save yet."""

    def __init__(self, signal_name: str):
        self.name = signal_name
        self.find_step: Callable[[], str | None] = lambda: None

    def attach(self, find_step: Callable[[], str | None]) -> None:
        self.find_step = find_step

    def ask(self) -> None:
        threading.Thread(target=self._send, name="distlaunch-checkpoint-signal", daemon=True).start()

    def _send(self) -> None:
        step = self.find_step()
        if step is not None:
            scancel(step, self.name)
