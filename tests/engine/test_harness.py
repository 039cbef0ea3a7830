"""The engine tests' job harness: a failed rank stops its peers at once, and a hung job ends at its
timeout with every rank's Python stack in the failure."""

from __future__ import annotations

import sys
import time

import pytest

from tests.engine.harness import spawn, spawn_ok

# rank 1 fails at once; rank 0 would wait for it (as in a collective) for a minute
ONE_FAILS = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
BOTH_HANG = "import time\ndef waiting_for_a_peer():\n    time.sleep(60)\nwaiting_for_a_peer()\n"


def test_a_failed_rank_stops_its_peers_and_is_the_one_reported():
    started = time.monotonic()
    results = spawn([sys.executable, "-c", ONE_FAILS], world_size=2, timeout=60)
    assert time.monotonic() - started < 30  # not the 60 s rank 0 would have waited
    assert results[1].returncode == 3 and not results[1].stopped
    assert results[0].stopped and results[0].returncode < 0  # ended by the harness
    with pytest.raises(AssertionError, match="2-rank job failed: rank 1 exited 3"):
        spawn_ok([sys.executable, "-c", ONE_FAILS], world_size=2, timeout=60)


def test_a_hung_job_ends_at_its_timeout_with_each_ranks_stack():
    with pytest.raises(AssertionError) as failure:
        spawn_ok([sys.executable, "-c", BOTH_HANG], world_size=2, timeout=3)
    message = str(failure.value)
    assert message.startswith("2-rank job timed out after 3s; where each rank was:")
    assert message.count("in waiting_for_a_peer") == 2, message  # faulthandler's dump of both ranks
