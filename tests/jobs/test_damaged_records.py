"""Job records and output files damaged on disk (a hand edit, a full disk, another tool): ``jobs`` still lists
every other job and names the damaged record with what is wrong in it, ``status`` and ``logs`` of it are one
line and exit 2, never a traceback (records of real jobs, damaged on disk; the real CLI, read back in-process
where a case only reads)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import invoke, run_cli, wait_until

TICKER = "import os, sys\nprint('hello from', os.environ['RANK'])\nsys.exit(int(sys.argv[1]) if os.environ['RANK'] == '1' else 0)\n"


def cli(state: Path, *args: str, cwd: Path):
    return run_cli(*args, cwd=cwd, env={"DISTLAUNCH_STATE_DIR": str(state)})


def read_back(state: Path, *args: str):
    """``distlaunch ARGS`` in-process, on ``state`` (for the cases that only read the records)."""
    return invoke(list(args), env={"DISTLAUNCH_STATE_DIR": str(state), "COLUMNS": "120"})


def one_line_error(code: int, stderr: str, *expected: str) -> str:
    assert code == 2, stderr
    line = stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: "), stderr
    assert "internal error" not in line and "Traceback" not in stderr
    for text in expected:
        assert text in line, line
    return line


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, str, str]:
    """A state directory with two real foreground jobs: (it, the failed job's id, the succeeded one's)."""
    work = tmp_path_factory.mktemp("jobs")
    (work / "ticker.py").write_text(TICKER)
    state = work / "state"
    assert cli(state, "run", "-n", "2", "ticker.py", "3", cwd=work).returncode == 3
    assert cli(state, "run", "-n", "1", "ticker.py", "0", cwd=work).returncode == 0
    ok, failed = json.loads(cli(state, "jobs", "--json", cwd=work).stdout)
    assert (ok["state"], failed["state"], failed["report"]["failures"][0]["rank"]) == ("succeeded", "failed", 1)
    return state, failed["job_id"], ok["job_id"]


def edit(change):
    def damage(path: Path) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))  # inf and NaN as Python's json writes them

    return damage


# name -> (damage to the failed job's job.json, what its one line says)
DAMAGE = {
    "empty": (lambda p: p.write_bytes(b""), "job.json is not a job record: not JSON (EOF while parsing"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:100]), "job.json is not a job record: not JSON ("),
    "a JSON list": (lambda p: p.write_text("[1, 2]"), "job.json is not a job record: not a JSON object"),
    "not UTF-8": (lambda p: p.write_bytes(b'{"job_id": "\xff\xfe"}'), "job.json is not a job record: not JSON ("),
    "start time infinite": (
        edit(lambda r: r.update(created_at=float("inf"))),
        "job.json is not a job record: created_at=inf: input should be a finite number",
    ),
    "start time past year 9999": (
        edit(lambda r: r.update(created_at=1e300)),
        "job.json is not a job record: created_at=1e+300: input should be less than or equal to 253402300799",
    ),
    "end time NaN": (
        edit(lambda r: r.update(ended_at=float("nan"))),
        "job.json is not a job record: ended_at=nan: input should be a finite number",
    ),
    "report of another shape": (
        edit(lambda r: r["report"]["failures"][0].pop("exit_code")),
        "job.json is not a job record: report: failures.0.exit_code is missing",
    ),
    "plan node without ranks": (
        edit(lambda r: r["plan"]["nodes"][0].pop("ranks")),
        "job.json is not a job record: plan: nodes.0.ranks is missing",
    ),
    "plan layout not a table": (
        edit(lambda r: r["plan"].update(parallel=5)),
        "job.json is not a job record: plan: parallel=5: input should be a valid dictionary",
    ),
    "a pipe": (lambda p: (p.unlink(), os.mkfifo(p)), "job.json cannot be read: not a regular file"),  # once, a wait
    "a folder": (lambda p: (p.unlink(), p.mkdir()), "job.json cannot be read: is a directory"),
    "another job's id": (
        edit(lambda r: r.update(job_id="../../elsewhere")),
        "job.json is not this job's record: it names job '../../elsewhere'",
    ),
}


@pytest.mark.timeout(60)  # a record the listing waits on fails here, not at the suite's limit
@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_record_is_named_and_the_other_jobs_are_still_listed(recorded, tmp_path, case):
    template, bad, ok = recorded
    state = tmp_path / "state"
    shutil.copytree(template, state)
    damage, problem = DAMAGE[case]
    damage(state / "jobs" / bad / "job.json")

    table = read_back(state, "jobs")
    assert table.exit_code == 0 and "Traceback" not in table.stderr, table.stdout + table.stderr
    rows = [line.split() for line in table.stdout.splitlines() if line.startswith("dl-") and ": " not in line]
    assert [row[0] for row in rows] == [ok, bad]
    assert rows[0][4:] == ["succeeded", rows[0][5], "0"] and rows[1][1:] == ["unreadable"]
    said = [line for line in table.stdout.splitlines() if line.startswith(f"{bad}: ")]
    assert len(said) == 1 and problem in said[0], table.stdout

    listed = json.loads(read_back(state, "jobs", "--json").stdout)
    assert [(j["job_id"], j["state"]) for j in listed] == [(ok, "succeeded"), (bad, "unreadable")]
    assert problem in listed[1]["problem"]

    status = read_back(state, "status", bad)
    one_line_error(status.exit_code, status.stderr, f"job {bad}: {problem}", str(state / "jobs" / bad))
    assert read_back(state, "status", ok).exit_code == 0
    assert not (state / "elsewhere").exists() and not (tmp_path / "elsewhere").exists()


def test_a_detached_jobs_output_file_removed_or_replaced_by_a_folder_is_one_line(tmp_path):
    state = tmp_path / "state"
    (tmp_path / "ticker.py").write_text(TICKER)
    r = cli(state, "run", "-n", "2", "--detach", "ticker.py", "0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert wait_until(lambda: "succeeded" in cli(state, "status", job, cwd=tmp_path).stdout, 60)
    output = state / "jobs" / job / "output.log"
    assert "[rank 1] hello from 1" in cli(state, "logs", job, cwd=tmp_path).stdout

    output.unlink()
    for follow in ([], ["--follow"]):  # it has ended: nothing will come, not "ran in a terminal"
        r = cli(state, "logs", job, *follow, cwd=tmp_path)
        expected = f"job {job} has ended, and its output file {output} is missing"
        one_line_error(r.returncode, r.stderr, expected, f"distlaunch status {job}")
    output.mkdir()
    r = cli(state, "logs", job, cwd=tmp_path)
    one_line_error(r.returncode, r.stderr, f"cannot read the output of job {job}: {output}: is a directory")
    assert cli(state, "status", job, cwd=tmp_path).returncode == 0
