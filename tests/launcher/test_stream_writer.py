"""The writer in front of each stream of a job's live output, on real pipes: what a stalled pipe never took is
counted line by line and rank by rank, and a pipe gets whole lines only, even one shared in non-blocking mode."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

from distlaunch.cli.streamwriter import StreamWriter

LINE = re.compile(r"\[rank (\d)\] line \d+ x{100}")
DROPPED = re.compile(r"distlaunch: dropped \d+ lines? \((\d+) bytes?\) of rank output \(([^)]*)\): this stream .*")


def accounted(data: bytes) -> tuple[Counter[int], int]:
    """The rank lines ``data`` holds whole or says it dropped, per rank, and their bytes; anything else (a line
    cut in two) fails."""
    assert data.endswith(b"\n"), data[-200:]
    seen: Counter[int] = Counter()
    size = 0
    for line in data.decode().splitlines():
        if match := LINE.fullmatch(line):
            seen[int(match[1])] += 1
            size += len(line) + 1
        else:
            match = DROPPED.fullmatch(line)
            assert match, line[:200]
            seen += Counter({int(rank): int(n) for n, rank in re.findall(r"(\d+) of rank (\d+)", match[2])})
            size += int(match[1])
    return seen, size


def flood(writer: StreamWriter, lines: int) -> tuple[Counter[int], int]:
    """Put ``lines`` rank lines of three ranks; how many of each rank, and their bytes."""
    size = 0
    for i in range(lines):
        text = f"[rank {i % 3}] line {i} {'x' * 100}\n"
        writer.put(text, i % 3)
        size += len(text)
    return Counter(i % 3 for i in range(lines)), size


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_what_a_stalled_pipe_never_took_is_counted_per_rank_and_it_holds_whole_lines():
    r, w = os.pipe()
    with open(w, "w") as stream:
        writer = StreamWriter(stream, limit=256 << 10)  # some lines wait, more are dropped, the pipe fills
        put, size = flood(writer, 5000)
        assert not writer.close(stall_s=0.3)  # nobody reads: it gives up
        lost = writer.unsent()
    data = read_all(r)
    os.close(r)
    got, got_size = accounted(data)
    assert got and lost, (got, lost)
    assert got + lost.lines == put  # every line in the pipe, whole, or counted there or as never taken
    assert got_size + lost.size == size


def test_a_non_blocking_pipe_waits_for_room_and_gets_every_line_whole():
    r, w = os.pipe()
    os.set_blocking(w, False)  # as when another process shares the file description in non-blocking mode
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(read_all(r)))
    reader.start()
    with open(w, "w") as stream:
        writer = StreamWriter(stream)
        put, _ = flood(writer, 20000)  # 2.5 MB: more than the pipe holds, less than the queue
        assert writer.close()
        assert writer.failed is None and not writer.unsent()
    reader.join(10)
    os.close(r)
    assert accounted(received[0])[0] == put


def test_a_stream_that_keeps_falling_behind_says_what_it_dropped_about_once_a_second():
    r, w = os.pipe()
    received: list[bytes] = []

    def slow_reader() -> None:  # about 800 KB/s, in small reads: every piece written makes room for more drops
        chunks = []
        while chunk := os.read(r, 4096):
            chunks.append(chunk)
            time.sleep(0.005)
        received.append(b"".join(chunks))

    reader = threading.Thread(target=slow_reader)
    reader.start()
    put: Counter[int] = Counter()
    with open(w, "w") as stream:
        writer = StreamWriter(stream, limit=64 << 10)
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # faster than the reader, for a second and a half
            put += flood(writer, 100)[0]
            time.sleep(0.002)
        assert writer.close()
    reader.join(10)
    os.close(r)
    got, _ = accounted(received[0])
    notices = received[0].count(b"distlaunch: dropped")
    assert got == put and 1 <= notices <= 4, notices
