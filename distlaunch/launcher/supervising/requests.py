"""What is asked of a running job from outside it, and the launcher's inbox for it.

Commands reach a job's launcher through files in the job's folder, never through a signal of their own: a file
asks nothing of a process that is not ready for it, and a launcher polls the folder on every turn of its loop
anyway. ``distlaunch stacks JOB`` and ``distlaunch checkpoint JOB`` / ``stop --checkpoint JOB`` each write one
request; the launcher takes it (removes it) and answers beside it when there is something to answer:

    jobs/<job id>/requests/<kind>-<unique>.json    {"kind": "stacks"} or {"kind": "checkpoint", "then": "stop"}
    jobs/<job id>/answers/<kind>-<unique>.json     {"saved_step": 120, "save_s": 2.1} or {"error": "..."}

Two signals come in too: the save signal (``--save-signal``, SIGUSR1 by default: Slurm's warning before a time limit,
``#SBATCH --signal=B:USR1@LEAD``) asks for a save and then a stop, and ``--forward-signals`` names signals passed on to
every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from distlaunch import protocol as p
from distlaunch.contract.report import REQUEUE_CODE
from distlaunch.errors import ExitCode, NoAnswer, UsageError
from distlaunch.jobs.store import STOP_FILE, JobRecord, job_folder
from distlaunch.launcher.supervising.watch import Agents, Stop, Watch

REQUESTS, ANSWERS = "requests", "answers"
POLL_S = 0.2  # how often the launcher looks into its requests folder
_KINDS = ("stacks", "checkpoint")


# What a launcher keeps for itself (INT, TERM, HUP stop the job), what cannot be caught, and what only a fault sends.
_NOT_FORWARDED = {"INT", "TERM", "HUP", "KILL", "STOP", "CHLD", "PIPE", "SEGV", "BUS", "FPE", "ILL", "ABRT", "SYS"}


def signal_name(text: str, flag: str) -> str:
    """A signal as the user wrote it (USR1, SIGUSR1, usr1, 10) -> its name without SIG, checked; a usage error
    naming ``flag`` otherwise."""
    raw = text.strip().upper().removeprefix("SIG")
    try:
        sig = signal.Signals(int(raw)) if raw.isdigit() else signal.Signals[f"SIG{raw}"]
    except (KeyError, ValueError):
        raise UsageError(f"{flag} {text!r} is not a signal", "name one such as USR1 or USR2") from None
    name = sig.name.removeprefix("SIG")
    if name in _NOT_FORWARDED:
        raise UsageError(
            f"{flag} {text!r}: SIG{name} is not one distlaunch can take for this",
            "INT, TERM and HUP stop the job; use USR1, USR2 or another signal the job does not otherwise get",
        )
    return name


def parse_save_signal(text: str) -> str | None:
    """``--save-signal``: a signal name, or none."""
    return None if text.strip().lower() == "none" else signal_name(text, "--save-signal")


def parse_forward_signals(text: str) -> list[str]:
    """``--forward-signals USR1,USR2``."""
    names = [signal_name(part, "--forward-signals") for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError("--forward-signals is empty", "name the signals, e.g. --forward-signals USR1,USR2")
    return list(dict.fromkeys(names))


def check_signals(save_signal: str | None, forward: list[str]) -> None:
    """One signal cannot both ask for a save and be passed on to the ranks."""
    if save_signal is not None and save_signal in forward:
        raise UsageError(
            f"SIG{save_signal} is both the save signal and one of --forward-signals",
            f"pick another --save-signal, or --save-signal none to pass SIG{save_signal} on to the ranks",
        )


def signal_number(name: str | None) -> int | None:
    return None if name is None else int(signal.Signals[f"SIG{name}"])


@dataclass
class SaveAsk:
    """A save asked of the job: ``then`` (stop | continue), ``why`` (who asked, in words), the exit code of a
    job that stops after it, and where to answer (a command that waits for the save)."""

    then: str
    why: str
    exit_code: int = REQUEUE_CODE  # the job's after a save-and-stop
    fallback_code: int = int(ExitCode.SIGTERM)  # the job's when the save did not come and it stopped without one
    reply: Path | None = None
    budget_s: float | None = None  # the save must be reported within this (None: the watch's default)


class JobRequests:
    """The launcher's inbox: stacks wanted (counted), saves asked, signals to forward. A context manager that
    traps the save signal and the forwarded ones while the job runs."""

    def __init__(self, folder: Path | None = None, save_signal: int | None = None, forward: tuple[int, ...] = ()):
        self.folder = folder
        self.save_signal, self.forward = save_signal, forward
        self.asked = 0  # stacks requests taken
        self.answered = 0  # of those, covered by a snapshot written or under way
        self.saves: list[SaveAsk] = []  # in the order they came; the save watch takes them
        self.signals: list[int] = []  # forwarded signals received, not yet passed on
        self._polled = 0.0
        self._saved: dict[int, object] = {}

    # -- stacks (launcher/supervising/hangwatch.py StacksOnRequest) ---------------------------------------------------------
    @property
    def waiting(self) -> bool:
        return self.asked > self.answered

    def take(self) -> None:
        """Every stacks request so far is covered by the snapshot that starts now."""
        self.answered = self.asked

    # -- the folder ----------------------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        """Take the requests written since the last look (at most every ``POLL_S``)."""
        if self.folder is None or now - self._polled < POLL_S:
            return
        self._polled = now
        try:
            found = sorted(os.scandir(self.folder / REQUESTS), key=lambda e: e.name)
        except OSError:
            return  # none asked yet (the folder is made by the first request)
        for entry in found:
            if not entry.name.endswith(".json"):
                continue  # a request still being written (.tmp)
            try:
                raw = json.loads(Path(entry.path).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raw = None
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
            if isinstance(raw, dict):
                self._take(raw, entry.name)

    def _take(self, raw: dict, name: str) -> None:
        if raw.get("kind") == "stacks":
            self.asked += 1
        elif raw.get("kind") == "checkpoint" and raw.get("then") in ("stop", "continue"):
            why = "distlaunch stop --checkpoint" if raw["then"] == "stop" else "distlaunch checkpoint"
            self.saves.append(SaveAsk(raw["then"], why, reply=self.folder / ANSWERS / name))

    def answer(self, ask: SaveAsk, answer: dict) -> None:
        """Tell a waiting command how its save went (written whole: a reader sees all of it or nothing)."""
        if ask.reply is None:
            return
        with contextlib.suppress(OSError):  # a full disk costs the answer, never the job
            ask.reply.parent.mkdir(parents=True, exist_ok=True)
            tmp = ask.reply.with_suffix(".tmp")
            tmp.write_text(json.dumps(answer), encoding="utf-8")
            os.replace(tmp, ask.reply)

    def stopped_by_command(self) -> bool:
        """Whether ``distlaunch stop`` (without --checkpoint) sent the SIGTERM: a stop, not a preemption."""
        return self.folder is not None and (self.folder / STOP_FILE).exists()

    # -- signals -------------------------------------------------------------------------------------------
    def __enter__(self) -> JobRequests:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            if self.save_signal is not None:
                self._saved[self.save_signal] = signal.signal(self.save_signal, self._on_save_signal)
            for sig in self.forward:
                self._saved[sig] = signal.signal(sig, self._on_forwarded)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _on_save_signal(self, signum, frame) -> None:
        self.saves.append(SaveAsk("stop", signal.Signals(signum).name, fallback_code=128 + signum))

    def _on_forwarded(self, signum, frame) -> None:
        self.signals.append(signum)


class ForwardSignals(Watch):
    """``--forward-signals``: each one received is passed on to every rank (its own process, not its children)."""

    def __init__(self, agents: Agents, inbox: JobRequests | None):
        self.agents, self.inbox = agents, inbox

    def tick(self, now: float) -> Stop | None:
        while self.inbox is not None and self.inbox.signals:
            name = signal.Signals(self.inbox.signals.pop(0)).name.removeprefix("SIG")
            self.agents.ask_pending(p.command(p.SIGNAL, sig=name))
        return None


# -- the commands' side ----------------------------------------------------------------------------------------


def post_request(record: JobRecord, kind: str, **fields) -> str:
    """Leave a request for the job's running launcher (checked: on this machine, the very process the record
    names, alive); its name, under which an answer comes (``wait_answer``)."""
    assert kind in _KINDS
    owner = record.owner
    if record.state == "lost" and owner is not None:
        raise UsageError(
            f"job {record.job_id} is lost: its launcher (pid {owner.pid} on {owner.hostname}) is gone",
            "there are no ranks left to ask",
        )
    if record.final or owner is None:
        raise UsageError(
            f"job {record.job_id} is {record.state}, not running", f"see 'distlaunch status {record.job_id}'"
        )
    if owner.hostname != os.uname().nodename:
        raise UsageError(
            f"job {record.job_id} is supervised on {owner.hostname}", f"run this command on {owner.hostname}"
        )
    if not owner.alive():  # pid and start time: never a stranger that took the pid over
        raise UsageError(
            f"job {record.job_id} is lost: its launcher (pid {owner.pid}) is gone", "there are no ranks left to ask"
        )
    folder = job_folder(record.job_id) / REQUESTS
    folder.mkdir(mode=0o700, exist_ok=True)
    name = f"{kind}-{time.time_ns()}-{uuid.uuid4().hex[:6]}.json"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps({"kind": kind, **fields}), encoding="utf-8")
    os.replace(tmp, folder / name)  # the launcher reads whole requests only
    return name


def wait_answer(record: JobRecord, name: str, timeout: float, what: str) -> dict:
    """The launcher's answer to request ``name``, waited for up to ``timeout`` seconds."""
    path = job_folder(record.job_id) / ANSWERS / name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            answer = json.loads(path.read_text(encoding="utf-8"))
            with contextlib.suppress(OSError):
                path.unlink()
            return answer
        time.sleep(0.1)
    raise NoAnswer(
        f"job {record.job_id} did not answer {what} within {timeout:g}s",
        f"it still may: see 'distlaunch logs {record.job_id}', or wait longer with --timeout",
    )


class StopRequest:
    """A stop that distlaunch itself asks of a running job, from another thread (per-node mode: another node
    failed). The job stops every rank in order, saying ``reason``, and ends with ``exit_code`` unless a rank
    of its own failed first."""

    def __init__(self):
        self.reason: str | None = None
        self.exit_code = 0

    def ask(self, reason: str, exit_code: int) -> None:
        if self.reason is None:
            self.exit_code = exit_code
            self.reason = reason  # last: the job's loop reads it as the flag
