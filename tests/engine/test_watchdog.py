"""The rank watchdog survives any deadline it is given, and still ends a hang with exit 124."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from distlaunch.engine.watchdog import STEP_TIMEOUT_EXIT

REPO = Path(__file__).resolve().parents[2]


def test_a_deadline_past_what_threading_can_wait_keeps_the_watchdog_alive():
    # Condition.wait(timeout) past threading.TIMEOUT_MAX (~9.2e9 s) raises OverflowError: the watchdog
    # thread died on it, and the later short deadline (a hang) never fired. The watchdog ends its process
    # with os._exit, so it runs in a process of its own (stdlib only: starts in well under a second).
    code = textwrap.dedent(
        """
        import math, threading, time
        from distlaunch.engine.watchdog import Watchdog

        dog = Watchdog(rank=3)
        for seconds in (1e10, threading.TIMEOUT_MAX * 2, 1e300, math.inf, math.nan):
            with dog.guard("a long save", seconds, "checkpoint.timeout"):
                time.sleep(0.1)  # the thread waits on this deadline meanwhile
        assert dog._thread is not None and dog._thread.is_alive(), "the watchdog thread died"
        with dog.guard("step 7", 0.3, "train.step_timeout"):
            time.sleep(30)  # a hang: the watchdog must end it
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == STEP_TIMEOUT_EXIT, r.stderr
    assert "error: rank 3: step 7 did not finish within 0.3s (train.step_timeout)" in r.stderr
    assert "OverflowError" not in r.stderr
