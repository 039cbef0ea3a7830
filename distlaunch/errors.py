"""The one error type distlaunch raises for user-facing problems, and the exit codes they map to.

Every user error carries what is wrong (with the offending value) and a hint that says how to fix
it. Exactly one place (``distlaunch.cli.app.main``) turns these into a printed line and an exit code.
"""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of the contract in docs/cli.md."""

    OK = 0
    CHECK_FAILED = 1  # doctor: at least one check failed; also an internal error
    NO_ANSWER = 1  # stop/stacks: the job did not answer within --timeout (it still may)
    USAGE = 2  # bad hostfile, bad spec, bad option
    HOST = 3  # a host could not be reached or prepared
    # no progress: the launcher's --hang-timeout, or a rank's own step watchdog (train.step_timeout), as timeout(1)
    HANG = 124
    # a checkpoint every rank saved because it was asked to (a save signal, a time limit coming, stop --checkpoint),
    # then the job stopped so that it can be requeued and resume there: sysexits' EX_TEMPFAIL, "try again later"
    SAVED_TO_REQUEUE = 75
    SIGINT = 130
    SIGTERM = 143
    # the reader of a pipe went away (``distlaunch jobs | head``): a quiet end with the status of a process that
    # died of SIGPIPE, as cat and grep end. A running job's launcher never ends so: its output survives that
    SIGPIPE = 141


class DistlaunchError(Exception):
    """A problem the user can fix: a message with the offending value, and a hint."""

    exit_code: int = ExitCode.USAGE

    def __init__(self, message: str, hint: str = "", *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class UsageError(DistlaunchError):
    """Bad input: hostfile, parallel spec, option or config (exit 2)."""

    exit_code = ExitCode.USAGE


class HostError(DistlaunchError):
    """A host could not be reached or prepared (exit 3)."""

    exit_code = ExitCode.HOST
    host: str | None = None  # the host it is about, where it is one host's (a spare takes its place)


class NoAnswer(DistlaunchError):
    """A running job did not answer within the time given (exit 1): not bad input, and it may still answer."""

    exit_code = ExitCode.NO_ANSWER


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice a typo most likely meant (``train.stepz`` -> ``train.steps``), None when none is close: the hint
    then names one key, not all of them."""
    found = difflib.get_close_matches(word, list(choices), n=1)
    return found[0] if found else None


def validation_problem(err) -> str:
    """A pydantic ``ValidationError`` as one line, ``field=value: why (and N more)``: pydantic's own text
    spreads over lines and does not show the value. Used for files distlaunch reads back (a job record, a
    dataset index, a checkpoint manifest), whose fields users do not type."""
    first = err.errors()[0]
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    field = ".".join(str(part) for part in first["loc"])
    why = first["msg"].removeprefix("Value error, ")
    if first["type"] == "json_invalid":
        return f"not JSON ({first.get('ctx', {}).get('error', why)})"
    if not field:
        return f"not a JSON object{more}"
    if first["type"] == "missing":
        return f"{field} is missing{more}"
    why = f"{why[:1].lower()}{why[1:]}{more}"
    if isinstance(first.get("input"), dict | list):  # a whole table: the reason names what is wrong in it
        return f"{field}: {why}"
    value = repr(first.get("input"))
    return f"{field}={value if len(value) <= 60 else value[:57] + '...'}: {why}"


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread to unwind a command (``distlaunch/interrupts.py``):
    it cleans up on the way, and the command exits 128 + the signal with one line. Not a KeyboardInterrupt,
    which the CLI framework would turn into a silent exit 130 whatever the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name
