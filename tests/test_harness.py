"""The tests' own process helpers: the engine harness stops a job when a rank fails and shows every
rank's stack when it hangs; ``finish`` waits for processes that run together without ever leaving one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.harness import spawn, spawn_ok
from tests.helpers import finish, running

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


def popen(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_finish_reads_every_pipe_at_once(tmp_path):
    # each writes 1 MiB (far over a pipe's 64 KiB); the first then waits for the second to be done, as
    # node 0 waits for node 1: read one after the other, the second blocks on its full pipe for ever
    flag = tmp_path / "second-done"
    first = f"import sys, time, os\nsys.stdout.write('x' * 2**20)\nsys.stdout.flush()\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n"
    second = f"import sys\nsys.stdout.write('x' * 2**20)\nsys.stdout.flush()\nopen({str(flag)!r}, 'w').close()\n"
    results = finish([popen(first), popen(second)], timeout=30)
    assert [(rc, len(out)) for rc, out, _ in results] == [(0, 2**20), (0, 2**20)]


def test_finish_kills_what_outlives_its_timeout_and_fails():
    late = popen("import sys, time\nprint('waiting', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    with pytest.raises(AssertionError, match=r"1 of 2 processes still ran after 2s \(killed\)"):
        finish([popen("pass"), late], timeout=2)
    assert late.returncode is not None  # gone, not left behind


def test_ranks_die_with_a_harness_killed_from_outside(tmp_path):
    # a pytest worker that CI's timeout kills never reaches the harness's cleanup: the ranks must go too
    pids = tmp_path / "pids"
    pids.mkdir()
    rank = (
        f"import os, time\npath = os.path.join({str(pids)!r}, os.environ['RANK'])\n"
        "open(path + '.tmp', 'w').write(str(os.getpid()))\nos.replace(path + '.tmp', path)\ntime.sleep(60)\n"
    )
    harness = f"import sys\nfrom tests.engine.harness import spawn\nspawn([sys.executable, '-c', {rank!r}], world_size=2, timeout=60)\n"
    proc = subprocess.Popen([sys.executable, "-c", harness], cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.glob("[0-9]"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int(p.read_text()) for p in pids.glob("[0-9]")]
        assert len(ranks) == 2
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while any(map(running, ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in ranks if running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their harness"
