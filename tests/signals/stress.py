"""Signals at any moment of a command's life, and what each try must leave: the harness of tests/signals/.

A try starts one command in a folder of its own (its own state directory, its own output places), sends one
signal (SIGINT, SIGTERM or SIGHUP) after a delay, waits for the command to end, and checks the outcome:

- it ended with 128 + the signal and said in a line what it stopped; or it died by the signal before it started
  anything (the interpreter's first moments, before distlaunch has a handler): then nothing of it may exist;
- never 0 or 1 while the signal reached it, never a traceback or "Exception ignored";
- nothing is left: no process that carries the try's mark in its environment (every process the command
  starts inherits it, over SSH too through a marking interpreter), no job record still ``running``, no
  half-written folder.

The delays are spread over the command's whole life (measured by one try without a signal): each try's delay
falls in its own slice of that life, so the tries together cover start-up, imports, the work and the end, and
no long run is repeated to get there. Tries run a few at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import pids_with_env, wait_until

MARK = "DISTLAUNCH_SIGNAL_TRY"  # every process a try starts carries it: how its leftovers are found
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TRY_TIMEOUT_S = 120.0
CONCURRENT = 3


@dataclass
class Command:
    """A command under test: its argv in a try's folder, and what it may leave there once it ended."""

    name: str
    argv: Callable[[Path], list[str]]
    leftovers: Callable[[Path], list[str]] = lambda folder: []  # what is half-written, in words
    signal_to: Callable[[subprocess.Popen, Path], int | None] | None = None  # default: the command's own pid
    ended: Callable[[subprocess.Popen, Path], int | None] | None = None  # the exit code, when not the process's
    said: Callable[[Path, str], str] = lambda folder, stderr: stderr  # what the command printed of its end
    ok_codes: tuple[int, ...] = (0,)  # how it may end with no signal
    # whether a signal sent at this wall-clock time still found the work going (default: the process was alive)
    reached: Callable[[Path, float], bool] | None = None


@dataclass
class Outcome:
    command: str
    signum: int
    delay: float
    returncode: int | None
    stderr: str
    signalled: bool
    problems: list[str] = field(default_factory=list)
    lived: float = 0.0  # from when the signal could be sent to the end
    # a second signal sent during the clean-up: while native code runs (a tokenizer's training, say) both wait,
    # and Python runs their handlers in the order of their numbers, so either may be the one the command sees first
    also: int | None = None

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        tail = self.stderr.strip().splitlines()[-3:]
        return (
            f"{self.command} {name} at {self.delay:.3f}s: exit {self.returncode}: {'; '.join(self.problems)} | {tail}"
        )


def try_folder(root: Path, label: str) -> Path:
    folder = root / label
    (folder / "state").mkdir(parents=True)
    return folder


def try_env(folder: Path) -> dict[str, str]:
    return {
        **os.environ,
        MARK: folder.name,
        "DISTLAUNCH_STATE_DIR": str(folder / "state"),
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }


def records(folder: Path) -> list[dict]:
    found = []
    for path in (folder / "state").rglob("job.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def run_try(
    command: Command, root: Path, label: str, signum: int | None, delay: float, second: tuple[int, float] | None = None
) -> Outcome:
    """One try: start, signal after ``delay`` (None: no signal), wait, check. ``second``: another signal, this
    long after the first, while the command cleans up after it (it must not leave anything behind either)."""
    folder = try_folder(root, label)
    proc = subprocess.Popen(
        command.argv(folder),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=try_env(folder),
        cwd=folder,
        start_new_session=True,  # a SIGHUP or SIGINT of the test's own terminal reaches no try
    )
    # the process that gets the signal, and from when its life counts: the command itself, from its start
    target = command.signal_to(proc, folder) if command.signal_to else proc.pid
    since = time.monotonic()
    signalled, sent_at = False, 0.0
    try:
        if signum is not None and target is not None:
            signalled = _signal_after(proc if command.signal_to is None else None, target, signum, since + delay)
            sent_at = time.time()
            if signalled and second is not None:
                _signal_after(proc if command.signal_to is None else None, target, second[0], since + delay + second[1])
        _, err = proc.communicate(timeout=TRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return Outcome(command.name, signum or 0, delay, None, err, signalled, ["still running after the signal"])
    code = command.ended(proc, folder) if command.ended else proc.returncode
    if signalled and command.reached is not None:
        signalled = command.reached(folder, sent_at)
    outcome = Outcome(command.name, signum or 0, delay, code, command.said(folder, err), signalled)
    outcome.also = second[0] if second is not None else None
    outcome.lived = time.monotonic() - since
    outcome.problems = _problems(command, folder, outcome)
    return outcome


def _signal_after(proc: subprocess.Popen | None, target: int, signum: int, at: float) -> bool:
    """Send the signal at ``at``; False when the target ended first (then no signal was sent)."""
    while time.monotonic() < at:
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(min(0.005, max(0.0, at - time.monotonic())))
    if (proc is not None and proc.poll() is not None) or exiting(target):
        return False
    try:
        os.kill(target, signum)
    except ProcessLookupError:
        return False
    return True


PF_EXITING = 0x4  # the kernel's flag of a task inside exit(): its code is decided, its memory being torn down


def exiting(pid: int) -> bool:
    """Whether the process has ended its life already, though not yet reaped: a command's last moment (its exit
    code is decided, the kernel frees its memory) lasts milliseconds, and a signal sent then meets no command."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] in "ZX" or bool(int(fields[6]) & PF_EXITING)


# Before distlaunch's first line runs, the interpreter starts by importing site (and the .pth files of its
# site-packages): a SIGINT then is CPython's own to answer. It ends with "Fatal Python error: init_import_site"
# (exit 1) where site itself was importing, and a .pth line that the interrupt broke is reported and skipped,
# the program then running as if no signal had come.
INTERPRETER_START = "Fatal Python error: init_import_site"
SITE_SKIPPED = "Error processing line"


def _before_distlaunch(outcome: Outcome) -> bool:
    """Whether the signal met the interpreter's own start-up, before any of distlaunch ran: site's imports, or the
    console script's import of the entry point, whose first line installs the handler (a KeyboardInterrupt whose
    traceback has no frame of ``entry`` came before it)."""
    if outcome.signum != signal.SIGINT:
        return False
    err = outcome.stderr
    importing = outcome.returncode == 1 and err.rstrip().endswith("KeyboardInterrupt") and " in entry" not in err
    return (
        (outcome.returncode == 1 and INTERPRETER_START in err) or (SITE_SKIPPED in err and ".pth" in err) or importing
    )


def _problems(command: Command, folder: Path, outcome: Outcome) -> list[str]:
    problems = []
    code, err = outcome.returncode, outcome.stderr
    died = code is not None and code < 0
    if outcome.signalled and _before_distlaunch(outcome):
        outcome.signalled = False  # not distlaunch's to answer: what it leaves is still checked below
        problems += [] if code in (1, *command.ok_codes) else [f"exit {code} after the interpreter's own start-up"]
    if outcome.signalled:
        if code == 128 + outcome.signum or (outcome.also is not None and code == 128 + outcome.also):
            if not any(word in err for word in ("interrupted", "SIGINT", "SIGTERM", "SIGHUP", "terminal was closed")):
                problems.append("no line says what was stopped")
        elif died and -code in (outcome.signum, outcome.also):
            if records(folder) or command.leftovers(folder):
                problems.append("died by the signal after it had started something")
        else:
            problems.append(f"exit {code}, not {128 + outcome.signum}")
        if not died and ("Traceback" in err or "Exception ignored" in err):
            problems.append("a traceback")
    elif code not in command.ok_codes and not _before_distlaunch(outcome):
        problems.append(f"exit {code} with no signal sent")
    running = [r["job_id"] for r in records(folder) if r.get("state") == "running"]
    if running:
        problems.append(f"job record still running: {running}")
    problems += command.leftovers(folder)
    if not wait_until(lambda: not pids_with_env(MARK, folder.name), timeout=10):
        problems.append(f"processes left: {_described(pids_with_env(MARK, folder.name))}")
        _end(pids_with_env(MARK, folder.name))
    return problems


def _described(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            out.append(f"{pid} {command}")
    return out


def _end(pids: list[int]) -> None:
    """End what a failed try left (these tries' own processes, found by their mark)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def life_of(command: Command, root: Path) -> float:
    """How long the command takes without a signal (and that it succeeds then): the shorter of two tries, for the
    first may meet cold caches or a busy moment of the machine and outlive every try after it."""
    lives = []
    for n in range(2):
        outcome = run_try(command, root, f"unsignalled-{n}", None, 0.0)
        assert not outcome.problems, str(outcome)
        lives.append(outcome.lived)
    return min(lives)


def _moments(life: float, tries: int, rng: random.Random) -> list[tuple[int, float]]:
    """``tries`` (signal, delay) pairs: the command's life cut into ``tries`` slices, a random moment in each, and
    the signals dealt over the slices in turns, so that each signal meets the whole life and no slice is met twice."""
    signals = [SIGNALS[i % len(SIGNALS)] for i in range(tries)]
    rng.shuffle(signals)
    return [(signum, life * (i + rng.random()) / tries) for i, signum in enumerate(signals)]


def stress(command: Command, root: Path, tries: int, seed: int = 0) -> list[Outcome]:
    """``tries`` tries in all (a third per signal), their delays spread over the command's life; every outcome."""
    rng = random.Random(seed)
    plan = _moments(life_of(command, root), tries, rng)
    rng.shuffle(plan)
    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        futures = [
            pool.submit(run_try, command, root, f"{signal.Signals(s).name}-{n}", s, delay)
            for n, (s, delay) in enumerate(plan)
        ]
        return [f.result() for f in futures]


def stress_twice(command: Command, root: Path, tries: int, seed: int = 0) -> list[Outcome]:
    """``tries`` tries in all (a third per first signal), each followed by a second (any of the three) within
    0.3 s."""
    rng = random.Random(seed)
    plan = [
        (s, delay, rng.choice(SIGNALS), rng.uniform(0.0, 0.3))
        for s, delay in _moments(life_of(command, root), tries, rng)
    ]
    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        futures = [
            pool.submit(run_try, command, root, f"twice-{n}", s, delay, (again, gap))
            for n, (s, delay, again, gap) in enumerate(plan)
        ]
        return [f.result() for f in futures]


def verdict(outcomes: list[Outcome]) -> str:
    """Every failed try in a line (empty when none failed); also fails when too few tries got their signal: the
    tries whose moment fell after the command's end (its life varies from try to try) test nothing."""
    failed = [str(o) for o in outcomes if o.problems]
    if sum(o.signalled for o in outcomes) < len(outcomes) * 0.75:
        failed.append(f"only {sum(o.signalled for o in outcomes)} of {len(outcomes)} tries reached the command alive")
    for signum in SIGNALS:
        sent = [o for o in outcomes if o.signum == signum]
        got = sum(1 for o in sent if o.signalled)
        if got < len(sent) / 2:
            failed.append(f"only {got} of {len(sent)} {signal.Signals(signum).name} tries reached the command alive")
    return "\n".join(failed)


def python_marking(folder: Path) -> Path:
    """An interpreter that runs this one with the try's mark set: what SSH hosts start, so their processes are
    found too (sshd does not pass the launcher's environment on)."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\nexport {MARK}={folder.name}\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path
