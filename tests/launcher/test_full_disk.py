"""A disk that fills up while a job runs costs what distlaunch writes there (rank logs, its stdout, the output of a
detached job), never the job, and never the record of how it ended: real small filesystems (tmpfs) that the
job's own rank 0 fills, as checkpoints in a home folder do."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import uuid
from pathlib import Path

from tests.fixtures.tmpfs import small_disk
from tests.helpers import distlaunch_cmd, left_behind, run_cli, wait_until

FILL = str(Path(__file__).parent / "scripts" / "fill_disk.py")


def cli(*args: str, state: Path, stdout=subprocess.PIPE, **env: str) -> subprocess.CompletedProcess:
    mark = uuid.uuid4().hex
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    argv = distlaunch_cmd(*args[:-1], "--grace-period", "2", "--env", f"DLTEST_MARK={mark}", args[-1])
    done = subprocess.run(
        argv,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={**base, "NO_COLOR": "1", "COLUMNS": "120", "DISTLAUNCH_STATE_DIR": str(state), **env},
    )
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"job processes left behind: {left}"
    return done


def status(job_id: str, state: Path) -> dict:
    r = run_cli("status", job_id, "--json", env={"DISTLAUNCH_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_rank_logs_on_a_disk_that_fills_up_stop_with_one_line_and_the_job_goes_on(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        r = cli("run", "-n", "2", "--log-dir", str(disk / "logs"), FILL, state=tmp_path / "state", FILL_DIR=str(disk))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines() if "rank logs in" in line]
    assert len(warnings) == 1, r.stderr[-3000:]
    assert "cannot be written (no space left on device): no more rank logs are written; the job goes on" in warnings[0]
    assert "[rank 1] rank 1 line 1999" in r.stdout  # every line still reached the terminal


def test_a_disk_the_ranks_fill_still_gets_the_record_of_how_the_job_ended(tmp_path):
    """The state directory shares the disk the ranks fill: the end's record lands in the room the job set aside
    when it started (without it, a finished job reads as lost)."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        state = disk / "state"
        r = cli("run", "-n", "2", FILL, state=state, FILL_DIR=str(disk), EXIT_CODE="7")
        assert r.returncode == 7, r.stderr[-3000:]
        assert "cannot record job" not in r.stderr, r.stderr[-3000:]
        (job,) = json.loads(run_cli("jobs", "--json", env={"DISTLAUNCH_STATE_DIR": str(state)}).stdout)
        assert (job["state"], job["exit_code"]) == ("failed", 7), job
        assert job["report"]["failures"][0]["rank"] == 0
        kept = sorted(os.listdir(state / "jobs" / job["job_id"]))
        assert [name for name in kept if not name.startswith("rank")] == ["job.json"]  # the room set aside: given back


def test_a_detached_job_whose_output_fills_the_disk_says_what_it_lost_and_how_it_ended(tmp_path):
    with small_disk(tmp_path / "disk", "4m") as disk:
        state = disk / "state"
        r = cli("run", "-n", "2", "--detach", FILL, state=state, FILL_DIR=str(disk), EXIT_CODE="5")
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.split()[0]
        assert wait_until(lambda: status(job_id, state)["state"] not in ("running", "pending"), 60)
        record = status(job_id, state)
        output = (state / "jobs" / job_id / "output.log").read_text()
    assert (record["state"], record["exit_code"]) == ("failed", 5), record
    lost = [line for line in output.splitlines() if "never reached stdout" in line]
    assert len(lost) == 1 and "as writing it failed: no space left on device" in lost[0], output[-3000:]
    assert f"job {job_id} failed (root cause first)" in output  # the report follows, in the room the end freed


def test_stdout_on_a_full_disk_is_counted_with_why_and_the_exit_code_stays(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk, open(disk / "out.txt", "w") as out:
        r = cli("run", "-n", "2", FILL, state=tmp_path / "state", stdout=out, FILL_DIR=str(disk), EXIT_CODE="3")
    assert r.returncode == 3, r.stderr[-3000:]
    lost = [line for line in r.stderr.splitlines() if "never reached stdout" in line]
    assert len(lost) == 1, r.stderr[-3000:]
    assert "as writing it failed: no space left on device" in lost[0]
    assert "rank 0 on localhost exited with code 3" in r.stderr


NAPPER = "import time\nprint('in place', flush=True)\ndef nap():\n    while True:\n        time.sleep(0.2)\nnap()\n"


def test_a_hang_on_a_full_disk_is_still_named_and_exits_124(tmp_path):
    """The stacks cannot be written where --log-dir keeps them: the one-line summary still says where the ranks
    wait, and the job ends as hung (it was an internal error, exit 1)."""
    napper = tmp_path / "napper.py"
    napper.write_text(NAPPER)
    with small_disk(tmp_path / "disk", "64k") as disk:
        logs = disk / "logs"
        logs.mkdir()
        with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        r = cli("run", "-n", "2", "--hang-timeout", "3", "--log-dir", str(logs), str(napper), state=tmp_path / "state")
    assert r.returncode == 124, r.stderr[-3000:]
    assert "internal error" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"distlaunch: hang: ranks 0-1 wait in (sleep|nap) \(napper\.py:\d\)", r.stderr), r.stderr[-3000:]
    assert "cannot write every rank's full stack" in r.stderr and "no space left on device" in r.stderr.lower()
    assert "every rank's stack:" not in r.stdout + r.stderr  # no folder is named that does not hold them
    assert sum("rank logs in" in line for line in r.stderr.splitlines()) == 1, r.stderr  # full from the start: once
