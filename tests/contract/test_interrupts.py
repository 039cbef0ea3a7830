"""distlaunch/interrupts.py, the one rule for signals, in a process of its own each (it owns the process's handlers):
a signal is recorded first, held where raising is unsafe, raised again after code swallowed it, counted once
the command is deciding its end, and never lets a second signal cut the first one's clean-up short."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

PRELUDE = """
import os, signal, sys
from distlaunch import interrupts
from distlaunch.errors import Interrupted
interrupts.install()
def kill(sig=signal.SIGTERM):
    os.kill(os.getpid(), sig)
"""


def run(body: str) -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_signal_in_a_held_part_is_raised_when_the_part_ends():
    done = run("""
        try:
            with interrupts.held():
                kill()
                print("held on", flush=True)
        except Interrupted as stop:
            print("raised", stop.signum)
    """)
    assert done.stdout.split("\n")[:2] == ["held on", f"raised {int(signal.SIGTERM)}"], done.stderr


def test_a_swallowed_signal_is_raised_again_at_the_next_check_and_said_nowhere_else():
    done = run("""
        class Finaliser:
            def __del__(self):
                kill(signal.SIGINT)  # its exception is raised here, where Python can only drop it
                for _ in range(1000):
                    pass
        Finaliser()
        print("went on", interrupts.pending(), flush=True)
        try:
            interrupts.check()
        except Interrupted as stop:
            print("raised", stop.signum)
    """)
    assert done.stdout.split("\n")[:2] == [f"went on {int(signal.SIGINT)}", f"raised {int(signal.SIGINT)}"], done
    assert "Exception ignored" not in done.stderr, done.stderr


def test_a_second_signal_during_the_first_ones_clean_up_is_counted_not_raised():
    done = run("""
        try:
            kill(signal.SIGINT)
            for _ in range(10**6):
                pass
        except Interrupted:
            kill(signal.SIGHUP)  # while cleaning up
            for _ in range(10**5):
                pass
            print("cleaned up", interrupts.first(), interrupts.exit_code(0), flush=True)
    """)
    assert done.stdout.strip() == f"cleaned up {int(signal.SIGINT)} {128 + signal.SIGINT}", done


def test_a_signal_while_the_command_decides_its_end_is_its_exit_code():
    done = run("""
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # it arrives, the command unaware
        kill()
        interrupts.leave(0, lambda signum: print("said", signum, flush=True))
    """)
    assert (done.returncode, done.stdout.strip()) == (128 + signal.SIGTERM, f"said {int(signal.SIGTERM)}"), done


def test_a_signal_answered_by_what_ran_is_not_the_commands_exit_code():
    done = run("""
        try:
            kill(signal.SIGINT)
            for _ in range(10**6):
                pass
        except Interrupted:
            interrupts.answer()  # as a job's trap does: its report's code is the command's
        interrupts.leave(7, lambda signum: print("said", signum))
    """)
    assert (done.returncode, done.stdout) == (7, ""), done


def test_nohup_keeps_a_hangup_ignored():
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + "kill(signal.SIGHUP)\nprint('still here', interrupts.first())"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert done.stdout.strip() == "still here None", done
