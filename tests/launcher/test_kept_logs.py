"""Every job keeps its ranks' logs, not only --log-dir or --detach jobs: real foreground runs through the CLI, then
'distlaunch logs' reads them back; rotation bounds them; the job store keeps the logs of its newest jobs only.

Each test has a state directory of its own (DISTLAUNCH_STATE_DIR), so two runs of this file never meet."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from distlaunch.jobs.logs import prune_logs
from distlaunch.jobs.store import JobRecord, Owner, jobs_dir, write_record
from tests.helpers import distlaunch_cmd, invoke, run_cli, wait_until

TALKER = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    for i in range(3):
        print(f"line {i} of rank {rank}", flush=True)
        time.sleep(0.05)
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0-complained")
    if rank == 1:  # complain after rank 0 has, so the merged stderr has one right order
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    print(f"rank {rank} complains", file=sys.stderr, flush=True)
    if rank == 0:
        open(marker, "w").close()
    """
)

# LINES lines of about 1 KiB, a pause of PAUSE_S after each
WRITER = textwrap.dedent(
    """
    import os, sys, time
    for i in range(int(os.environ["LINES"])):
        print(f"line {i:06d} " + "x" * 1000, flush=True)
        time.sleep(float(os.environ.get("PAUSE_S", "0")))
    print("the last line", flush=True)
    """
)


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    """A private state directory; the CLI subprocesses inherit it."""
    folder = tmp_path / "state"
    monkeypatch.setenv("DISTLAUNCH_STATE_DIR", str(folder))
    return folder


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, env={"DISTLAUNCH_STATE_DIR": os.environ["DISTLAUNCH_STATE_DIR"], **(env or {})})


def only_job(state: Path) -> str:
    (job,) = [p.name for p in (state / "jobs").iterdir()]
    return job


def test_a_foreground_jobs_lines_are_kept_and_logs_shows_them_per_rank(state, tmp_path):
    (tmp_path / "talker.py").write_text(TALKER)
    r = cli("run", "-n", "2", "talker.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = only_job(state)
    assert sorted(p.name for p in (state / "jobs" / job).glob("rank*")) == ["rank0.log", "rank1.log"]

    everything = cli("logs", job, cwd=tmp_path)
    assert everything.returncode == 0, everything.stderr
    lines = everything.stdout.splitlines()
    for rank in (0, 1):  # each rank's lines in order, merged with the other's by time
        mine = [ln for ln in lines if ln.startswith(f"[rank {rank}] ")]
        assert mine == [
            *(f"[rank {rank}] line {i} of rank {rank}" for i in range(3)),
            f"[rank {rank}] rank {rank} complains",
        ]
    assert len(lines) == 8

    one = cli("logs", job, "--rank", "1", cwd=tmp_path)
    assert one.stdout.splitlines() == [*(f"[rank 1] line {i} of rank 1" for i in range(3)), "[rank 1] rank 1 complains"]
    assert cli("logs", job, "--rank", "0", "--tail", "2", cwd=tmp_path).stdout.splitlines() == [
        "[rank 0] line 2 of rank 0",
        "[rank 0] rank 0 complains",
    ]
    assert cli("logs", job, "--stderr", cwd=tmp_path).stdout.splitlines() == [
        "[rank 0] rank 0 complains",
        "[rank 1] rank 1 complains",
    ]
    followed = cli("logs", job, "--follow", "--rank", "1", cwd=tmp_path)  # ended: prints and returns
    assert followed.returncode == 0 and followed.stdout == one.stdout

    record = json.loads(cli("status", job, "--json", cwd=tmp_path).stdout)
    assert record["rank_logs"] == str(state / "jobs" / job)
    assert f"logs       {state / 'jobs' / job}" in cli("status", job, cwd=tmp_path).stdout


def test_with_log_dir_the_logs_stay_there_and_logs_reads_them(state, tmp_path):
    (tmp_path / "talker.py").write_text(TALKER)
    r = cli("run", "-n", "2", "--log-dir", "logs", "talker.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = only_job(state)
    assert sorted(p.name for p in (tmp_path / "logs" / job).iterdir()) == ["rank0.log", "rank1.log"]
    assert not list((state / "jobs" / job).glob("rank*"))  # not twice
    shown = cli("logs", job, "--rank", "0", cwd=tmp_path.parent)  # from anywhere: the record's path is absolute
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "[rank 0] line 0 of rank 0"


def test_a_rank_log_is_rotated_at_the_bound_and_logs_shows_the_newest_lines(state, tmp_path):
    (tmp_path / "writer.py").write_text(WRITER)
    r = cli("run", "-n", "1", "--log-max-size", "64KiB", "writer.py", cwd=tmp_path, env={"LINES": "1000"})
    assert r.returncode == 0, r.stderr
    folder = state / "jobs" / only_job(state)
    parts = sorted(p.name for p in folder.glob("rank0.log*"))
    assert parts == ["rank0.log", "rank0.log.1"]  # one previous part, never more
    for name in parts:
        assert (folder / name).stat().st_size <= 64 << 10, name
    assert (folder / "rank0.log").read_text().startswith("# distlaunch job ")  # each part says whose lines
    assert "continued from rank0.log.1" in (folder / "rank0.log").read_text().splitlines()[0]

    shown = cli("logs", only_job(state), cwd=tmp_path).stdout.splitlines()
    assert shown[-1] == "[rank 0] the last line"
    numbers = [int(ln.split()[3]) for ln in shown[:-1]]
    assert numbers == list(range(numbers[0], 1000)), "the newest lines, whole, in order, across both parts"
    assert 64 < len(numbers) < 130  # about two parts of 1 KiB lines
    tail = cli("logs", only_job(state), "--tail", "2", cwd=tmp_path).stdout.splitlines()
    assert tail == [f"[rank 0] line 000999 {'x' * 1000}", "[rank 0] the last line"]


def test_logs_follow_reads_on_across_rotations(state, tmp_path):
    """A follower that keeps up misses nothing when the log it reads becomes the previous part."""
    (tmp_path / "writer.py").write_text(WRITER)
    env = {**os.environ, "LINES": "200", "PAUSE_S": "0.02", "NO_COLOR": "1"}
    argv = distlaunch_cmd("run", "-n", "1", "--log-max-size", "64KiB", "writer.py")
    job = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: (state / "jobs").is_dir() and any((state / "jobs").iterdir()), 30)
        follower = subprocess.run(
            distlaunch_cmd("logs", only_job(state), "--follow"), cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    finally:
        _, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    assert follower.returncode == 0, follower.stderr
    assert len(list((state / "jobs" / only_job(state)).glob("rank0.log*"))) == 2  # it was rotated meanwhile
    lines = follower.stdout.splitlines()
    assert lines == [*(f"[rank 0] line {i:06d} {'x' * 1000}" for i in range(200)), "[rank 0] the last line"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [("lots", "--log-max-size 'lots' is not a size"), ("1KiB", "--log-max-size 1KiB is below 64KiB")],
)
def test_a_bad_log_max_size_is_one_line(value, problem, tmp_path):
    (tmp_path / "talker.py").write_text(TALKER)
    r = invoke(["run", "--log-max-size", value, "--dry-run", str(tmp_path / "talker.py")])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: {problem}") and r.stderr.count("\n") == 1, r.stderr


def _recorded(job_id: str, created_at: float, state: str = "succeeded", owner: Owner | None = None) -> Path:
    record = JobRecord(
        job_id=job_id, backend="local", command=[], cwd="/", hosts=["localhost"], world_size=1, state=state,
        created_at=created_at, owner=owner, rank_logs=str(jobs_dir() / job_id),
    )  # fmt: skip
    folder = write_record(record).parent
    for name in ("rank0.log", "rank0.log.1", "output.log", "errors.log"):
        (folder / name).write_text("a line\n")
    (folder / "stacks").mkdir()
    (folder / "stacks" / "rank0.txt").write_text("a stack\n")
    return folder


def test_the_store_keeps_the_logs_of_its_newest_jobs_and_every_record(state):
    now = time.time()
    newest, newer, old = (_recorded(f"dl-{n}", now - n) for n in (1, 2, 3))
    running = _recorded("dl-4", now - 4, state="running", owner=Owner.me())  # a long job among short ones
    lost = _recorded(
        "dl-5", now - 5, state="running", owner=Owner(pid=2**22 + 1, start_ticks=1, hostname=os.uname().nodename)
    )
    prune_logs(keep=2)
    for kept in (newest, newer, running):
        assert (kept / "rank0.log").exists() and (kept / "rank0.log.1").exists() and (kept / "output.log").exists()
    for pruned in (old, lost):  # the record and the stacks stay: status and the stacks still answer
        assert sorted(p.name for p in pruned.iterdir()) == ["job.json", "stacks"]


def test_logs_of_a_job_whose_logs_were_pruned_says_so(state, tmp_path):
    folder = _recorded("dl-0123456789ab", time.time() - 60)
    for name in ("rank0.log", "rank0.log.1", "output.log", "errors.log"):
        (folder / name).unlink()
    r = cli("logs", "dl-0123456789ab", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "job dl-0123456789ab's logs were removed: distlaunch keeps the logs of the 20 newest jobs" in r.stderr


def test_a_multi_host_jobs_logs_are_kept_by_its_launcher_and_name_each_host(sshd_cluster, state, tmp_path):
    """Over real SSH: the agents forward every line, and the launcher's machine keeps every rank's log."""
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", nhosts=2, slots=1)
    (tmp_path / "talker.py").write_text(TALKER)
    argv = ["run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), str(tmp_path / "talker.py")]
    r = cli(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = only_job(state)
    shown = cli("logs", job, "--rank", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    host = sshd_cluster.aliases[1]  # one slot per host: rank 1 ran on the second host
    assert shown.stdout.splitlines() == [
        *(f"[{host} rank 1] line {i} of rank 1" for i in range(3)),
        f"[{host} rank 1] rank 1 complains",
    ]
