"""Real processes on this machine: --log-dir writes the job folder and every rank's log (its header, with the
real start time) when the ranks start, and each restart's mark when the restart starts, not at first output."""

import calendar
import os
import re
import subprocess
import time
from pathlib import Path

from tests.helpers import distlaunch_cmd, run_cli, wait_until

HEADER = re.compile(r"^# distlaunch job (dl-\S+): rank (\d+) \(local rank (\d+)\) on (\S+), started (\S+)$")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z")
RESTART = re.compile(r"^# --- restart (\d+), (\S+) ---$")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "NO_COLOR": "1", "COLUMNS": "120", **extra}


def seconds(stamp: str) -> float:
    """A log stamp (2026-11-23T09:05:01.123Z) as seconds since the epoch."""
    m = STAMP.match(stamp)
    assert m, stamp
    return calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S")) + int(m[2]) / 1000


def write_script(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(body)
    return str(path)


def only_job(log_dir: Path) -> Path:
    jobs = list(log_dir.iterdir())
    assert len(jobs) == 1 and jobs[0].name.startswith("dl-"), f"no job folder in {log_dir}: {jobs}"
    return jobs[0]


def read_log(job: Path, rank: int) -> tuple[re.Match, list[str], list[str]]:
    """(the header's first line, its '#' lines, its output lines) of rank<N>.log."""
    path = job / f"rank{rank}.log"
    assert path.exists(), f"rank {rank} has no log: {sorted(p.name for p in job.iterdir())}"
    lines = path.read_text().splitlines()
    header = HEADER.match(lines[0])
    assert header, lines[:4]
    assert (header[1], int(header[2])) == (job.name, rank)
    return header, [ln for ln in lines if ln.startswith("#")], [ln for ln in lines if not ln.startswith("#")]


SILENT = """\
import os, sys
sys.exit(3 if os.environ["RANK"] == "1" else 0)
"""


def test_a_rank_that_never_prints_still_gets_its_log_with_header(tmp_path):
    silent = write_script(tmp_path, "silent.py", SILENT)
    logs = tmp_path / "logs"
    r = run_cli("run", "-n", "2", "--local-ranks-filter", "0", "--log-dir", str(logs), silent, env=clean_env())
    assert r.returncode == 3, r.stderr
    assert "rank 1 on localhost exited with code 3" in r.stderr
    job = only_job(logs)
    for rank in (0, 1):  # the failed rank 1 too, hidden on the terminal and silent: its command is on record
        header, comments, lines = read_log(job, rank)
        assert (int(header[3]), header[4]) == (rank, "localhost")
        assert any(c.startswith("# command: ") and "silent.py" in c for c in comments), comments
        assert any(c.startswith("# plan: world_size=2 nnodes=1") for c in comments), comments
        assert lines == []  # nothing printed, nothing invented


SLEEPY = """\
import os, time
time.sleep(float(os.environ["SLEEP_S"]))
print(f"rank {os.environ['RANK']} awake", flush=True)
"""


def test_the_header_says_when_the_rank_started_not_when_it_first_printed(tmp_path):
    sleepy = write_script(tmp_path, "sleepy.py", SLEEPY)
    logs = tmp_path / "logs"
    launched = time.time()
    r = run_cli("run", "-n", "2", "--log-dir", str(logs), sleepy, env=clean_env(SLEEP_S="3"))
    assert r.returncode == 0, r.stderr
    job = only_job(logs)
    for rank in (0, 1):
        header, _, lines = read_log(job, rank)
        started = seconds(header[5])
        assert lines and lines[0].endswith(f"out| rank {rank} awake"), lines
        first_output = seconds(lines[0])
        assert launched - 0.01 <= started, (launched, header[5])
        assert first_output - started >= 2.0, f"started {header[5]}, first output {lines[0]}"  # it slept 3 s


RESTARTED = """\
import os, sys, time
if os.environ["DISTLAUNCH_RESTART_COUNT"] == "0":
    sys.exit(3 if os.environ["RANK"] == "1" else 0)  # the first try ends without a word
time.sleep(float(os.environ["SLEEP_S"]))
print(f"rank {os.environ['RANK']} try 1", flush=True)
"""


def test_a_restart_is_marked_when_it_starts_even_after_a_silent_try(tmp_path):
    restarted = write_script(tmp_path, "restarted.py", RESTARTED)
    logs = tmp_path / "logs"
    launched = time.time()
    r = run_cli("run", "-n", "2", "--max-restarts", "1", "--log-dir", str(logs), restarted, env=clean_env(SLEEP_S="3"))
    assert r.returncode == 0, r.stderr
    assert "restarting the job (1/1)" in r.stderr
    job = only_job(logs)
    for rank in (0, 1):
        header, comments, lines = read_log(job, rank)
        marks = [RESTART.match(c) for c in comments if RESTART.match(c)]
        assert [int(m[1]) for m in marks] == [1], comments
        started, restarted_at = seconds(header[5]), seconds(marks[0][2])
        assert launched - 0.01 <= started <= restarted_at  # the header is the first try's start
        assert [ln.split("| ", 1)[1] for ln in lines] == [f"rank {rank} try 1"]
        assert seconds(lines[0]) - restarted_at >= 2.0, f"restart {marks[0][2]}, first output {lines[0]}"


def test_restarts_of_ranks_that_never_print_are_marked_too(tmp_path):
    silent = write_script(tmp_path, "silent.py", SILENT)
    logs = tmp_path / "logs"
    r = run_cli("run", "-n", "2", "--max-restarts", "2", "--log-dir", str(logs), silent, env=clean_env())
    assert r.returncode == 3, r.stderr
    assert "gave up after 2 restarts" in r.stderr
    job = only_job(logs)
    for rank in (0, 1):
        _, comments, lines = read_log(job, rank)
        assert [int(m[1]) for m in map(RESTART.match, comments) if m] == [1, 2], comments
        assert lines == []


WAITING = """\
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_logs_are_written_while_silent_ranks_run_and_hold_no_descriptor(tmp_path):
    """Headers are there while the ranks still run; a rank that has not printed costs the launcher no open file
    (a job of thousands of ranks must not hold a descriptor per rank for its headers)."""
    waiting = write_script(tmp_path, "waiting.py", WAITING)
    logs, go = tmp_path / "logs", tmp_path / "go"
    proc = subprocess.Popen(
        distlaunch_cmd("run", "-n", "4", "--log-dir", str(logs), waiting, str(go)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        logged = lambda: sorted(p.name for p in logs.glob("dl-*/rank*.log"))  # noqa: E731
        assert wait_until(lambda: len(logged()) == 4, 60), f"logs while the ranks run: {logged()}"
        job = only_job(logs)
        for rank in range(4):
            read_log(job, rank)
        held = []
        for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
            try:
                held.append(os.readlink(fd))
            except OSError:
                continue  # closed meanwhile
        assert not [h for h in held if h.startswith(str(logs))], held
        assert proc.poll() is None  # the ranks were still running all along
    finally:
        go.touch()
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_a_rank_that_cannot_start_gets_its_log_with_the_reason(tmp_path):
    """No 'started' comes from the agent for a rank it could not start, only its reason and its exit."""
    logs = tmp_path / "logs"
    broken = write_script(tmp_path, "broken", "#!/no/such/interpreter\n")
    os.chmod(broken, 0o755)  # passes the launcher's checks; exec fails in the agent
    r = run_cli("run", "-n", "1", "--no-python", "--log-dir", str(logs), broken, env=clean_env())
    assert r.returncode == 127, r.stderr
    job = only_job(logs)
    _, comments, lines = read_log(job, 0)
    assert any(c.startswith("# command: ") and "broken" in c for c in comments), comments
    assert len(lines) == 1 and "err| distlaunch: cannot start" in lines[0], lines
