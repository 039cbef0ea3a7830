"""A reader slower than the ranks: every line it never gets is counted in a notice, per rank and per stream; no
line arrives cut; the rank logs keep them all. Real processes: 4 ranks write both streams at once, and the
launcher's stdout is a pipe read at about 1.5 MiB/s once they are done; its stderr is read as fast as it comes,
or is that same slow pipe (``2>&1``)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from distlaunch.launcher.supervising.ranklogs import parse_line
from tests.helpers import distlaunch_cmd, wait_until

NUMBERED = str(Path(__file__).parent / "scripts" / "numbered.py")
RANKS, LINES, PAD = 4, 1300, 1000  # about 5 MiB to stdout in all: past the 4 MiB a stream may queue
RATE = 3 << 19  # bytes a second that the slow reader takes
LINE = re.compile(r"\[rank (\d)\] r\1 (out|err) \d+ (x+)")
PADS = {"out": PAD, "err": PAD // 10}  # numbered.py's lines: their x's
DROPPED = re.compile(r"distlaunch: dropped \d+ lines? \(\d+ bytes?\) of rank output \(([^)]*)\): this stream")
NEVER = re.compile(r"distlaunch: \d+ lines? \(\d+ bytes?\) of rank output never reached stdout \(([^)]*)\)")


def said(counts: str, stream: str) -> Counter[tuple[int, str]]:
    """``602 of rank 0, 988 of rank 1`` (lines of ``stream``), or ``602 of rank 0's out, …``, by (rank, stream)."""
    found = re.findall(r"(\d+) of rank (\d+)(?:'s (stdout|stderr))?", counts)
    return Counter({(int(rank), named[3:] if named else stream): int(n) for n, rank, named in found})


def read(stream, into: list[bytes], start: threading.Event | None = None) -> None:
    """Read ``stream`` to its end: at RATE once ``start`` is set, or as fast as it comes (no ``start``)."""
    if start is not None:
        start.wait()
    while chunk := os.read(stream.fileno(), 16384):
        into.append(chunk)
        if start is not None:
            time.sleep(len(chunk) / RATE)


def run_slowly_read(tmp_path: Path, together: bool) -> tuple[str, str]:
    """The job's stdout and stderr as their readers got them (``together``: one slow pipe for both)."""
    done = tmp_path / "done"
    done.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    argv = distlaunch_cmd("run", "-n", str(RANKS), "--log-dir", str(tmp_path / "logs"), NUMBERED)
    env.update(NO_COLOR="1", LINES=str(LINES), PAD=str(PAD), DONE_DIR=str(done))
    err_to = subprocess.STDOUT if together else subprocess.PIPE
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_to, env=env)
    out: list[bytes] = []
    err: list[bytes] = []
    start = threading.Event()
    readers = [threading.Thread(target=read, args=(proc.stdout, out, start))]
    if not together:
        readers.append(threading.Thread(target=read, args=(proc.stderr, err)))
    for reader in readers:
        reader.start()
    try:
        assert wait_until(lambda: len(os.listdir(done)) == RANKS, 60)  # all written: the launcher has dropped some
        start.set()
        assert proc.wait(timeout=60) == 0
    finally:
        start.set()
        proc.kill()
        for reader in readers:
            reader.join(10)
    return b"".join(out).decode(), b"".join(err).decode()


@pytest.mark.parametrize("together", [False, True], ids=["stderr-apart", "stderr-on-stdout"])
def test_a_slow_reader_gets_a_count_of_every_line_it_missed_per_rank_and_stream(tmp_path, together):
    out, err = run_slowly_read(tmp_path, together)
    seen: Counter[tuple[int, str]] = Counter()
    announced: Counter[tuple[int, str]] = Counter()
    for name, text in (("out", out), ("err", err)):
        for line in text.splitlines():
            if (match := LINE.fullmatch(line)) and len(match[3]) == PADS[match[2]]:
                assert together or match[2] == name, line  # each stream's lines on the launcher's same stream
                seen[(int(match[1]), match[2])] += 1
            elif match := DROPPED.match(line):
                announced += said(match[1], name)  # a stream says what it dropped itself
            elif match := NEVER.match(line):
                announced += said(match[1], "out")  # what stdout never took, said on stderr at the end
            else:  # a notice or the report, never a rank line cut in two
                assert "[rank" not in line and "x" * 50 not in line, line[:200]
                assert together or name == "err", line[:200]
    sent = {(rank, stream): LINES for rank in range(RANKS) for stream in ("out", "err")}
    missing = +Counter({key: n - seen[key] for key, n in sent.items()})
    assert sum(missing.values()) > 0, "the reader kept up: nothing was dropped, nothing was tested"
    assert announced == missing, (err or out)[-3000:]
    for rank in range(RANKS):  # the rank logs keep every line, whatever the terminal missed
        (log,) = (tmp_path / "logs").glob(f"*/rank{rank}.log")
        logged = Counter(parsed[1] for raw in log.read_bytes().splitlines() if (parsed := parse_line(raw)))
        assert logged == {"out": LINES, "err": LINES}, (rank, logged)
