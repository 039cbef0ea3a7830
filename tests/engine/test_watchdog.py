"""The rank watchdog survives any deadline it is given, and still ends a hang with exit 124."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from distlaunch.engine.watchdog import STEP_TIMEOUT_EXIT
from tests.helpers import run_cli

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


WAITER = textwrap.dedent(
    """
    import sys, time, torch, torch.distributed as dist
    from distlaunch.engine.watchdog import Watchdog

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=rank, world_size=2)
    print("joined", flush=True)
    if rank == 1:
        time.sleep(60)  # the hang: never gets to the all-reduce
    with Watchdog(rank).guard("step 1", 1.0, "train.step_timeout"):
        dist.all_reduce(torch.ones(4))
    """
)


def test_a_rank_waiting_in_a_collective_says_so_and_lets_the_hung_rank_go_first(tmp_path):
    """Real gloo: rank 0 waits in an all-reduce that rank 1 never joins. Its watchdog says which collective
    it waits in, and exits only after a grace (the hung rank's own watchdog would end that rank first)."""
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WAITER, str(rank), str(store)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for rank in (0, 1)
    ]
    try:
        _, err = procs[0].communicate(timeout=60)
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert procs[0].returncode == STEP_TIMEOUT_EXIT, err
    reason = err.rstrip("\n").rsplit("\n", 1)[-1]
    assert reason.startswith(
        "error: rank 0: step 1 did not finish within 1s (train.step_timeout): it waits in all_reduce for a rank "
        "that did not get there"
    ), err


def test_the_failure_table_names_the_hung_rank_with_its_one_line_reason(tmp_path):
    """``distlaunch train`` with rank 1 hung at step 3: its watchdog goes first (rank 0 waits in a collective
    a little longer), and the table shows rank 1's reason, not the tail of its stacks."""
    sets = ["train.steps=6", "fault.rank=1", "fault.step=3", "fault.kind='hang'", "train.step_timeout=3"]
    r = run_cli(
        "train", "-n", "2", "--grace-period", "1", *[a for s in sets for a in ("--set", s)], cwd=tmp_path, timeout=180
    )
    assert r.returncode == STEP_TIMEOUT_EXIT, r.stdout[-3000:] + r.stderr[-3000:]
    after = r.stderr[r.stderr.index("failed (root cause first)") :]
    table = after[: after.index("┘") + 1]
    rows = [line for line in table.splitlines() if line.startswith("│ ")]
    assert rows[0].startswith("│ 1 "), table  # root cause first
    below = " ".join(after[after.index("┘") + 1 :].split())  # each rank's error, under the table
    assert "error: rank 1: step 3 did not finish within 3s (train.step_timeout): it is not waiting" in below, below
    assert "File " not in below, below
