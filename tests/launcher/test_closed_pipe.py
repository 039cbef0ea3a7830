"""A reader that goes away (``distlaunch jobs | head``) ends distlaunch quietly with the status of a process that
SIGPIPE ended (141), as cat and grep end; a running job's launcher is never ended so: it goes on, and exits with
the job's own code. The real command in a real shell pipeline (``set -o pipefail``: the status is distlaunch's)."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from tests.helpers import distlaunch_cmd

DISTLAUNCH = shlex.join(distlaunch_cmd())
SIGPIPE_STATUS = 141


def piped(command: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {command}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state"), "NO_COLOR": "1"},
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        "--help",
        "--version",
        "jobs",
        "jobs --json",
        "run --dry-run -n 4 x.py",
        "train --dry-run",
        "train --dry-run --json",
    ],
)
def test_a_reader_that_left_ends_distlaunch_quietly_with_sigpipes_status(args, tmp_path):
    (tmp_path / "x.py").write_text("print('hi')\n")
    done = piped(f"{DISTLAUNCH} {args} | true", tmp_path)  # true reads nothing: every write meets a closed pipe
    assert done.returncode == SIGPIPE_STATUS, done.stderr
    assert done.stderr == ""  # no message, no traceback, no "Exception ignored"


def test_head_reads_the_first_line_and_distlaunch_ends_quietly(tmp_path):
    (tmp_path / "x.py").write_text("print('hi')\n")
    # a plan far larger than a pipe holds: distlaunch is still writing when head has its line and leaves
    done = piped(f"{DISTLAUNCH} run --dry-run --json -n 256 x.py | head -1", tmp_path)
    assert done.returncode == SIGPIPE_STATUS and done.stdout == "{\n" and done.stderr == "", done.stderr


def test_the_exit_status_is_the_processs_own(tmp_path):
    proc = subprocess.Popen(
        distlaunch_cmd("jobs", "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env={**os.environ, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    proc.stdout.close()  # the reader leaves before distlaunch writes a byte
    assert proc.wait(timeout=60) == SIGPIPE_STATUS
    assert proc.stderr.read() == b""
    proc.stderr.close()


UNREAD = {  # what of a running job nobody reads
    "its rank output and report": "run -n 2 {script} 2>&1 | true",
    "its JSON report": "run -n 2 --json {script} 2>/dev/null | true",
}


@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.parametrize("unread", sorted(UNREAD))
def test_a_running_job_outlives_its_reader_and_exits_with_its_own_code(code, unread, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(f"import sys\nfor i in range(50):\n    print('line', i, flush=True)\nsys.exit({code})\n")
    done = piped(f"{DISTLAUNCH} " + UNREAD[unread].format(script=script), tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
