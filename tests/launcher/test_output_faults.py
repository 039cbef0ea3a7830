"""Output never holds supervision up: a stdout nobody reads, a 50 MiB line, \\r progress bars (real processes)."""

import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

from distlaunch.agent import SPLIT_MARK
from tests.helpers import children, distlaunch_cmd, left_behind, pids_with_env, wait_until

FLOOD = str(Path(__file__).parent / "scripts" / "flood.py")


def launcher(tmp_path: Path, *args: str, stdout=subprocess.PIPE, **env) -> tuple[subprocess.Popen, str, Path]:
    """Start the real launcher; stderr goes to a file (read at the end), stdout as the test asks."""
    mark = uuid.uuid4().hex
    err = tmp_path / f"stderr-{mark}.txt"
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with open(err, "wb") as err_file:
        proc = subprocess.Popen(
            distlaunch_cmd(*args[:-1], "--env", f"DLTEST_MARK={mark}", args[-1]),
            stdout=stdout,
            stderr=err_file,
            env={**base, "NO_COLOR": "1", "COLUMNS": "120", **env},
        )
    return proc, mark, err


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM) so far, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_blocked_stdout_does_not_stop_fail_fast_or_lose_the_exit_code(tmp_path):
    # stdout is a pipe that this test never reads: it fills within milliseconds of the flood.
    proc, mark, err = launcher(
        tmp_path, "run", "-n", "3", "--grace-period", "2", FLOOD, MODE="FLOOD", FAIL_RANK="2", FAIL_CODE="5"
    )
    try:
        proc.wait(timeout=90)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 5, text
    assert "rank 2 on localhost exited with code 5" in text
    assert "rank 2 failing now" in text
    assert re.search(r"distlaunch: \d+ lines \(\d+ bytes\) of rank output never reached stdout", text), text
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"job processes left behind: {left}"


def test_sigterm_stops_a_flooding_job_whose_stdout_nobody_reads(tmp_path):
    proc, mark, err = launcher(tmp_path, "run", "-n", "2", "--grace-period", "2", FLOOD, MODE="FLOOD")
    try:
        assert wait_until(lambda: len(pids_with_env("DLTEST_MARK", mark)) >= 2, 60), err.read_text()
        time.sleep(2)  # the flood has long filled the pipe
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err.read_text()
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"job processes left behind: {left}"


def test_a_50_mib_line_arrives_whole_in_marked_pieces_with_flat_memory(tmp_path):
    # stdout is a file: it takes every piece at once, so none is dropped for a reader that fell behind (a pipe
    # that a busy test reads may lag 4 MiB, and then lines are dropped by design: the test above)
    out_path = tmp_path / "stdout.txt"
    with open(out_path, "wb") as out:
        proc, _mark, err = launcher(tmp_path, "run", "-n", "1", FLOOD, stdout=out, MODE="BIGLINE", BIG_MIB="50")
    peaks = {"launcher": 0.0, "agent": 0.0}
    while proc.poll() is None:  # sample the peaks until the launcher ends
        try:
            peaks["launcher"] = max(peaks["launcher"], peak_rss_mib(proc.pid))
            for child in children(proc.pid):
                peaks["agent"] = max(peaks["agent"], peak_rss_mib(child))
        except (OSError, AssertionError):
            pass
        time.sleep(0.05)
    seen = {"payload": 0, "pieces": 0, "bad": [], "after": False}
    with open(out_path, "rb") as out:
        for raw in out:
            line = raw.decode().rstrip("\n")
            if not line.startswith("[rank 0] "):
                seen["bad"].append(line[:80])
                continue
            body = line[len("[rank 0] ") :]
            if body == "after-big":
                seen["after"] = True
            elif body.endswith(SPLIT_MARK):
                seen["pieces"] += 1
                seen["payload"] += len(body) - len(SPLIT_MARK)
            else:
                seen["payload"] += len(body)
    assert proc.returncode == 0, err.read_text()
    assert seen["payload"] == 50 << 20 and seen["pieces"] >= 50 and seen["after"], seen
    assert not seen["bad"]
    # Before output was bounded, this line cost over 200 MiB in each process; generous bounds, not timings.
    assert 0 < peaks["launcher"] < 150, peaks
    assert 0 < peaks["agent"] < 80, peaks


def test_a_carriage_return_progress_bar_shows_before_any_newline(tmp_path):
    proc, _mark, err = launcher(tmp_path, "run", "-n", "1", "--grace-period", "1", FLOOD, MODE="PROGRESS")
    got = []
    try:
        deadline = time.monotonic() + 60
        while "[rank 0] progress 20%" not in got:
            assert time.monotonic() < deadline, (got, err.read_text())
            line = proc.stdout.readline().decode()
            assert line, (got, err.read_text())
            got.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert got == ["[rank 0] progress 10%", "[rank 0] progress 20%"]
    assert proc.returncode == 143


def test_processes_left_in_a_new_session_are_ended_and_counted(tmp_path):
    straggler = str(Path(__file__).parent / "scripts" / "straggler.py")
    for code in ("0", "4"):  # a job that succeeds and one that fails
        proc, mark, err = launcher(tmp_path, "run", "-n", "2", straggler, stdout=subprocess.DEVNULL, EXIT_CODE=code)
        try:
            proc.wait(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == int(code), err.read_text()
        assert not pids_with_env("DLTEST_MARK", mark), "a setsid child outlived the job"
        assert "ended 2 stray processes the ranks left behind" in err.read_text()
