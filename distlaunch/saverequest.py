"""A rank's side of a save request: has someone asked this job to save a checkpoint now?

Requests reach a rank by one of two ways, both read here (standard library only: it runs in every rank):

- Under a distlaunch agent (``run``, ``train``, local or SSH, per-node), the agent replaces the rank's request file,
  ``$DISTLAUNCH_REQUEST_FILE``, with one JSON object: ``{"id": 3, "then": "stop", "why": "SIGUSR1"}``. ``then`` is
  ``continue`` (``distlaunch checkpoint JOB``: save and train on) or ``stop`` (a save signal, SIGTERM with time to
  save, ``distlaunch stop --checkpoint``: save, then the job stops).
- Under srun, where no agent stands between Slurm and the rank, ``$DISTLAUNCH_SAVE_SIGNAL`` names a signal (USR1)
  that ``distlaunch slurm run`` forwards to every rank: a request to save, then stop; ``$DISTLAUNCH_CHECKPOINT_SIGNAL``
  (USR2) one to save and train on. The first look arms them.

A request stays pending until the rank reports a newer checkpoint (``distlaunch.progress(saved_step=...)``) after it
saw the request. Each rank sees a request on its own time: a loop whose ranks must save the same step agrees
first (the bundled engine all-reduces the answer; docs/surviving-failures.md shows a plain loop doing it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from typing import NamedTuple

STOP, CONTINUE = "stop", "continue"  # what follows the save


class SaveRequest(NamedTuple):
    """One request: ``then`` is what follows the save (``stop`` or ``continue``), ``why`` who asked, in words."""

    id: int
    then: str
    why: str


def rank_signals(environ) -> dict[signal.Signals, str]:
    """The signals a rank saves on under srun, each with what follows the save: ``$DISTLAUNCH_SAVE_SIGNAL`` (stop)
    and ``$DISTLAUNCH_CHECKPOINT_SIGNAL`` (continue), as ``distlaunch slurm run`` names them (USR1, SIGUSR2)."""
    found = {}
    for var, then in (("DISTLAUNCH_SAVE_SIGNAL", STOP), ("DISTLAUNCH_CHECKPOINT_SIGNAL", CONTINUE)):
        name = environ.get(var, "").strip().upper().removeprefix("SIG")
        sig = getattr(signal, f"SIG{name}", None) if name and name != "NONE" else None
        if isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP):
            found[sig] = then
    return found


class _Requests:
    def __init__(self) -> None:
        self.answered = 0  # the newest request id a reported save answered
        self.seen: SaveRequest | None = None  # the newest request read, answered or not
        self.signalled: SaveRequest | None = None  # the save signal's request (srun), until a save answers it
        self.file_stamp: tuple[int, int] | None = None
        self.armed = False
        self.termed = False  # a SIGTERM asked for a save (arm_term): the next one ends the rank

    def arm(self) -> None:
        """Trap ``$DISTLAUNCH_SAVE_SIGNAL`` (once, from the main thread: only there can Python set a handler)."""
        if self.armed or threading.current_thread() is not threading.main_thread():
            return
        self.armed = True
        for sig, then in rank_signals(os.environ).items():
            signal.signal(sig, lambda signum, frame, then=then: self._on_signal(signum, then))

    def arm_term(self) -> None:
        """Under srun, SIGTERM too asks for a save and a stop (Slurm sends it straight to every rank at a time limit
        it gave no warning of, on ``scancel``, on a preemption); a second SIGTERM ends the rank as SIGTERM does."""
        saves_and_stops = STOP in rank_signals(os.environ).values()
        if not saves_and_stops or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, lambda signum, frame: self._on_term())

    def _on_term(self) -> None:
        if self.termed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.termed = True
        self._on_signal(signal.SIGTERM)

    def _on_signal(self, signum: int, then: str = STOP) -> None:
        if self.signalled is None or (then == STOP and self.signalled.then != STOP):
            self.signalled = SaveRequest(-1, then, signal.Signals(signum).name)

    def pending(self) -> SaveRequest | None:
        """The request waiting for a save, if any (the signal's first: it comes with a deadline)."""
        self.arm()
        self._read_file()
        if self.signalled is not None:
            return self.signalled
        if self.seen is not None and self.seen.id > self.answered:
            return self.seen
        return None

    def _read_file(self) -> None:
        path = os.environ.get("DISTLAUNCH_REQUEST_FILE")
        if not path:
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self.file_stamp:  # the common case, every step: one stat, nothing read
            return
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return  # replaced whole by the agent: a later look reads the new one
        self.file_stamp = stamp
        if isinstance(raw, dict) and isinstance(raw.get("id"), int) and raw.get("then") in (STOP, CONTINUE):
            self.seen = SaveRequest(raw["id"], raw["then"], str(raw.get("why") or "a request"))

    def saved(self) -> None:
        """A newer checkpoint was reported: it answers every request seen before."""
        if self.seen is not None:
            self.answered = max(self.answered, self.seen.id)
        self.signalled = None


_requests = _Requests()


def save_request() -> SaveRequest | None:
    """The save request this rank has not answered yet, or None. Cheap (one ``stat``): call it every step."""
    with contextlib.suppress(Exception):  # never fail a rank over a request
        return _requests.pending()
    return None


def save_on_sigterm() -> None:
    """Where distlaunch forwards a save signal (under ``distlaunch slurm run``), let SIGTERM ask for a save and a
    stop as well, once; for a loop that stops by itself after the save (the bundled engine does)."""
    with contextlib.suppress(Exception):
        _requests.arm_term()


def answered() -> int:
    """A newer checkpoint was reported (``distlaunch.progress``): the id of the newest request it answers, which
    the rank's progress report carries so the launcher knows its request, not an older save, was answered."""
    with contextlib.suppress(Exception):
        _requests.saved()
    return _requests.answered
