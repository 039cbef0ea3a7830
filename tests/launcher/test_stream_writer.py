"""The writer in front of each stream of a job's live output, on real pipes and files: what a stalled pipe never
took is counted line by line and rank by rank; a pipe gets whole lines only, even one shared in non-blocking
mode; a file takes every line, however far the writer falls behind; stdout and stderr that are one pipe share a
writer whose notices name each rank's stream."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

from distlaunch.cli.output import RankPrinter
from distlaunch.cli.streamwriter import Lost, StreamWriter, keeps_up, same_file

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


def by_rank(lost: Lost) -> Counter[int]:
    return Counter({rank: n for (rank, _fd), n in lost.lines.items()})


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_what_a_stalled_pipe_never_took_is_counted_per_rank_and_it_holds_whole_lines():
    r, w = os.pipe()
    with open(w, "w") as stream:
        writer = StreamWriter(stream, limit=256 << 10)  # some lines wait, more are dropped, the pipe fills
        assert not writer.keeps_up
        put, size = flood(writer, 5000)
        assert not writer.close(stall_s=0.3)  # nobody reads: it gives up
        lost = writer.unsent()
    data = read_all(r)
    os.close(r)
    got, got_size = accounted(data)
    assert got and lost, (got, lost)
    assert got + by_rank(lost) == put  # every line in the pipe, whole, or counted there or as never taken
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


def test_a_file_takes_every_line_whole_and_in_order_however_far_its_writer_falls_behind(tmp_path):
    # A queue of 2 KiB: the writer falls behind at once. A reader's stream would drop; a file makes put wait.
    path = tmp_path / "out.txt"
    with open(path, "w") as stream:
        writer = StreamWriter(stream, limit=2 << 10)
        assert writer.keeps_up
        put, size = flood(writer, 20000)
        assert writer.close() and not writer.unsent()
    data = path.read_bytes()
    assert accounted(data) == (put, size)  # no drop notice: every line, whole
    assert [int(n) for n in re.findall(rb"line (\d+)", data)] == list(range(20000))


def test_what_keeps_up_and_what_may_fall_behind(tmp_path):
    r, w = os.pipe()
    master, slave = os.openpty()
    with open(tmp_path / "f", "w") as file, open(os.devnull, "w") as null:
        assert keeps_up(file.fileno()) and keeps_up(null.fileno()) and keeps_up(None)
    assert not keeps_up(w) and not keeps_up(slave)
    for fd in (r, w, master, slave):
        os.close(fd)


def test_stdout_and_stderr_on_one_pipe_share_a_writer_that_names_each_ranks_stream():
    r, w = os.pipe()
    other = os.dup(w)  # 2>&1: two descriptors of one pipe
    with open(w, "w") as out, open(other, "w") as err:
        assert same_file(out, err)
        printer = RankPrinter(multi_host=False, out=out, err=err, color=False, job_id="dl-1")
        assert printer.err is printer.out
        printer.out.limit = 8 << 10  # nobody reads yet: most lines are dropped
        for i in range(3000):
            printer.rank_line("localhost", i % 2, 1 + i % 3 // 2, f"line {i} {'x' * 100}")
        received: list[bytes] = []
        reader = threading.Thread(target=lambda: received.append(read_all(r)))
        reader.start()
        printer.close()
    reader.join(10)
    os.close(r)
    text = received[0].decode()
    shown = Counter(
        (int(rank), 2 if int(n) % 3 == 2 else 1) for rank, n in re.findall(r"\[rank (\d)\] line (\d+)", text)
    )
    announced: Counter[tuple[int, int]] = Counter()
    for said in re.findall(r"dropped \d+ lines? \(\d+ bytes?\) of rank output \(([^)]*)\)", text):
        for n, rank, stream in re.findall(r"(\d+) of rank (\d)'s (stdout|stderr)", said):
            announced[(int(rank), 1 if stream == "stdout" else 2)] += int(n)
    sent = Counter((i % 2, 1 + i % 3 // 2) for i in range(3000))
    assert announced and shown + announced == sent, (shown, announced)


def test_lost_lines_are_said_per_rank_and_per_stream_where_a_stream_carries_both():
    one = Lost()
    for owed in ((3, 1), (0, 1), (3, 1)):
        one.add(("x\n", owed))
    assert (one.count(), one.per_rank()) == ("3 lines (6 bytes)", "1 of rank 0, 2 of rank 3")
    both = Lost()
    for owed in ((0, 2), (0, 1), (1, 1)):
        both.add(("x\n", owed))
    assert both.per_rank(name_streams=True) == "1 of rank 0's stdout, 1 of rank 0's stderr, 1 of rank 1's stdout"
