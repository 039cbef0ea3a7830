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


def script(folder: Path, code: str) -> list[str]:
    path = folder / "rank.py"
    path.write_text(code)
    return [sys.executable, str(path)]


FORKED = pytest.mark.parametrize("forked", [False, True], ids=["started", "forked"])


@FORKED
def test_a_failed_rank_stops_its_peers_and_is_the_one_reported(tmp_path, forked):
    started = time.monotonic()
    results = spawn(script(tmp_path, ONE_FAILS), world_size=2, timeout=60, forked=forked)
    assert time.monotonic() - started < 30  # not the 60 s rank 0 would have waited
    assert results[1].returncode == 3 and not results[1].stopped
    assert results[0].stopped and results[0].returncode < 0  # ended by the harness
    with pytest.raises(AssertionError, match="2-rank job failed: rank 1 exited 3"):
        spawn_ok(script(tmp_path, ONE_FAILS), world_size=2, timeout=60, forked=forked)


@FORKED
def test_a_hung_job_ends_at_its_timeout_with_each_ranks_stack(tmp_path, forked):
    with pytest.raises(AssertionError) as failure:
        spawn_ok(script(tmp_path, BOTH_HANG), world_size=2, timeout=3, forked=forked)
    message = str(failure.value)
    assert message.startswith("2-rank job timed out after 3s; where each rank was:")
    assert message.count("in waiting_for_a_peer") == 2, message  # faulthandler's dump of both ranks


def test_forked_ranks_are_processes_of_their_own_with_the_torchrun_environment(tmp_path):
    """Forked from the zygote, each rank has its own pid and session, its own environment and output files."""
    code = (
        "import os, sys, torch\n"
        "print(os.getpid(), os.getsid(0), os.environ['RANK'], os.environ['WORLD_SIZE'], 'torch' in sys.modules)\n"
        "print('rank', os.environ['RANK'], 'on stderr', file=sys.stderr)\n"
    )
    results = spawn_ok(script(tmp_path, code), world_size=2, timeout=60, forked=True)
    seen = [r.stdout.split() for r in results]
    assert [(s[2], s[3], s[4]) for s in seen] == [("0", "2", "True"), ("1", "2", "True")], seen
    assert len({s[0] for s in seen}) == 2 and all(s[0] == s[1] for s in seen), seen  # each leads its session
    assert [r.stderr for r in results] == ["rank 0 on stderr\n", "rank 1 on stderr\n"]


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


@FORKED
def test_ranks_die_with_a_harness_killed_from_outside(tmp_path, forked):
    # a pytest worker that CI's timeout kills never reaches the harness's cleanup: the ranks must go too
    pids = tmp_path / "pids"
    pids.mkdir()
    rank = (
        f"import os, time\npath = os.path.join({str(pids)!r}, os.environ['RANK'])\n"
        "open(path + '.tmp', 'w').write(str(os.getpid()))\nos.replace(path + '.tmp', path)\ntime.sleep(60)\n"
    )
    argv = script(tmp_path, rank)
    harness = f"from tests.engine.harness import spawn\nspawn({argv!r}, world_size=2, timeout=60, forked={forked})\n"
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


def test_every_quick_entry_names_a_test_file_or_a_test_in_it():
    """``pytest -m quick`` marks what tests/conftest.py QUICK names: a renamed test must not fall out of it unseen."""
    from tests.conftest import QUICK, ROOT

    stale = []
    for entry in QUICK:
        path, _, name = entry.partition("::")
        source = ROOT / path
        if not source.is_file() or (name and f"def {name}(" not in source.read_text()):
            stale.append(entry)
    assert not stale, f"QUICK names what is not there: {stale}"
