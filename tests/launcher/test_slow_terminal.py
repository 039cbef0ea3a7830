"""A terminal slower than the ranks: every line it never gets is counted in a notice, per rank and per stream; no
line arrives cut; the rank logs keep them all. Real processes: 4 ranks write both streams at once, and the
launcher's stdout is read at about 1 MiB/s once they are done (its stderr as fast as it comes)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

from distlaunch.launcher.supervising.ranklogs import parse_line
from tests.helpers import distlaunch_cmd, wait_until

NUMBERED = str(Path(__file__).parent / "scripts" / "numbered.py")
RANKS, LINES, PAD = 4, 1300, 1000  # about 5 MiB to stdout in all: past the 4 MiB a stream may queue
RATE = 3 << 19  # bytes a second that the slow reader takes
LINE = re.compile(r"\[rank (\d)\] r\1 (out|err) \d+ (x+)")
PADS = {"out": PAD, "err": PAD // 10}  # numbered.py's lines: their x's
DROPPED = re.compile(r"distlaunch: dropped \d+ lines? \(\d+ bytes?\) of rank output \(([^)]*)\): this stream")
NEVER = re.compile(r"distlaunch: \d+ lines? \(\d+ bytes?\) of rank output never reached stdout \(([^)]*)\)")


def per_rank(said: str) -> Counter[int]:
    """``602 of rank 0, 988 of rank 1`` as a Counter."""
    return Counter({int(rank): int(n) for n, rank in re.findall(r"(\d+) of rank (\d+)", said)})


def read(stream, into: list[bytes], start: threading.Event | None = None) -> None:
    """Read ``stream`` to its end: at RATE once ``start`` is set, or as fast as it comes (no ``start``)."""
    if start is not None:
        start.wait()
    while chunk := os.read(stream.fileno(), 16384):
        into.append(chunk)
        if start is not None:
            time.sleep(len(chunk) / RATE)


def test_a_slow_stdout_gets_a_count_of_every_line_it_missed_per_rank_and_stream(tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    argv = distlaunch_cmd("run", "-n", str(RANKS), "--log-dir", str(tmp_path / "logs"), NUMBERED)
    env.update(NO_COLOR="1", LINES=str(LINES), PAD=str(PAD), DONE_DIR=str(done))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out: list[bytes] = []
    err: list[bytes] = []
    start = threading.Event()
    readers = [
        threading.Thread(target=read, args=(proc.stdout, out, start)),
        threading.Thread(target=read, args=(proc.stderr, err)),
    ]
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
    streams = {"out": b"".join(out).decode(), "err": b"".join(err).decode()}
    seen = {"out": Counter(), "err": Counter()}
    announced = {"out": Counter(), "err": Counter()}
    for name, text in streams.items():
        for line in text.splitlines():
            if (match := LINE.fullmatch(line)) and len(match[3]) == PADS[match[2]]:
                assert match[2] == name, line  # each stream's lines on the launcher's same stream
                seen[name][int(match[1])] += 1
            elif match := DROPPED.match(line):
                announced[name] += per_rank(match[1])  # a stream says what it dropped itself
            elif match := NEVER.match(line):
                announced["out"] += per_rank(match[1])  # what stdout never took, said on stderr at the end
            else:  # a notice or the report, never a rank line cut in two
                assert name == "err" and "[rank" not in line and "x" * 50 not in line, line[:200]
    missing = {name: Counter({r: LINES - seen[name][r] for r in range(RANKS)}) for name in seen}
    assert sum(missing["out"].values()) > 0, "the reader kept up: nothing was dropped, nothing was tested"
    assert announced == {name: +lines for name, lines in missing.items()}, streams["err"][-3000:]
    for rank in range(RANKS):  # the rank logs keep every line, whatever the terminal missed
        (log,) = (tmp_path / "logs").glob(f"*/rank{rank}.log")
        logged = Counter(parsed[1] for raw in log.read_bytes().splitlines() if (parsed := parse_line(raw)))
        assert logged == {"out": LINES, "err": LINES}, (rank, logged)
