"""``distlaunch stacks JOB``: where every rank of a running job is, asked for through the real CLI while real
jobs run (detached and in the foreground), and the job running on afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distlaunch.backends.slurm_batch import record_batch_job
from distlaunch.jobs.store import JobRecord, Owner, write_record
from tests.helpers import distlaunch_cmd, pids_with_env, wait_until
from tests.jobs.test_jobs import cli, status_json

# Three gloo ranks: rank 1 naps in a function of its own while ranks 0 and 2 wait for it in a barrier.
HOLD = textwrap.dedent(
    """
    import time
    import torch.distributed as dist

    def distinctive_nap():
        while True:
            time.sleep(0.2)

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()} in place", flush=True)
    if dist.get_rank() == 1:
        distinctive_nap()
    dist.barrier()
    """
)

# No torch: rank 0 waits on an event, rank 1 naps; for the foreground run and the error cases.
PAIR = textwrap.dedent(
    """
    import os, threading, time

    def wait_for_a_signal():
        threading.Event().wait()

    def nap_forever():
        while True:
            time.sleep(0.2)

    print("in place", flush=True)
    wait_for_a_signal() if os.environ["RANK"] == "0" else nap_forever()
    """
)


@pytest.fixture
def state(tmp_path, monkeypatch):
    d = tmp_path / "state"
    monkeypatch.setenv("DISTLAUNCH_STATE_DIR", str(d))
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "pair.py").write_text(PAIR)
    return d


def detach(tmp_path, *args: str) -> str:
    r = cli("run", "--detach", "--grace-period", "2", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def in_place(job_id: str, tmp_path, ranks: int) -> bool:
    return cli("logs", job_id, cwd=tmp_path).stdout.count("in place") == ranks


def stop_and_check_nothing_left(job_id: str, tmp_path) -> None:
    stopped = cli("stop", job_id, "--json", cwd=tmp_path)
    assert json.loads(stopped.stdout)["state"] == "stopped", stopped.stderr
    assert wait_until(lambda: not pids_with_env("DISTLAUNCH_JOB_ID", job_id), 10)


def test_stacks_name_where_each_rank_waits_and_the_job_runs_on(state, tmp_path):
    job_id = detach(tmp_path, "-n", "3", "hold.py")
    assert wait_until(lambda: in_place(job_id, tmp_path, 3), 90, interval=0.3)
    ranks = pids_with_env("DISTLAUNCH_JOB_ID", job_id)

    asked = cli("stacks", job_id[:7], "--json", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    snapshot = json.loads(asked.stdout)
    groups = [(g["ranks"], g["where"], g["hosts"]) for g in snapshot["groups"]]
    assert groups == [
        ([0, 2], "barrier (hold.py:13)", ["localhost"]),
        ([1], "distinctive_nap (hold.py:7)", ["localhost"]),
    ]
    folder = Path(snapshot["folder"])
    assert (snapshot["number"], folder) == (1, state / "jobs" / job_id / "stacks-1")
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.txt", "rank1.txt", "rank2.txt"]
    assert "distinctive_nap" in (folder / "rank1.txt").read_text()  # as py-spy or faulthandler prints it

    # The job runs on: same processes, still running; a second request makes a new snapshot beside the first.
    assert status_json(job_id, tmp_path)["state"] == "running"
    assert sorted(pids_with_env("DISTLAUNCH_JOB_ID", job_id)) == sorted(ranks)
    again = cli("stacks", job_id, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"job {job_id}: ranks 0,2 wait in barrier (hold.py:13); rank 1 in distinctive_nap (hold.py:7) on localhost",
        f"full stacks: {state / 'jobs' / job_id / 'stacks-2'}",
    ]
    assert (folder / "rank1.txt").exists() and (state / "jobs" / job_id / "stacks-1.json").exists()
    assert "distlaunch: stacks on request: ranks 0,2 wait in barrier" in cli("logs", job_id, cwd=tmp_path).stdout
    stop_and_check_nothing_left(job_id, tmp_path)


def test_stacks_of_a_foreground_job(state, tmp_path):
    proc = subprocess.Popen(
        distlaunch_cmd("run", "-n", "2", "--grace-period", "2", "pair.py"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )
    try:
        assert "in place" in proc.stdout.readline() and "in place" in proc.stdout.readline()
        [job] = json.loads(cli("jobs", "--running", "--json", cwd=tmp_path).stdout)
        asked = cli("stacks", job["job_id"], cwd=tmp_path)
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout.splitlines()[0] == (
            f"job {job['job_id']}: rank 0 waits in wait (pair.py:5); rank 1 in nap_forever (pair.py:9) on localhost"
        )
        assert proc.poll() is None  # the launcher took the signal and runs on
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stacks on request: rank 0 waits in wait (pair.py:5)" in err
    assert not pids_with_env("DISTLAUNCH_JOB_ID", job["job_id"])


def test_a_launcher_that_does_not_answer_in_time_is_reported(state, tmp_path):
    job_id = detach(tmp_path, "-n", "2", "pair.py")
    assert wait_until(lambda: in_place(job_id, tmp_path, 2), 30, interval=0.2)
    supervisor = status_json(job_id, tmp_path)["owner"]["pid"]
    os.kill(supervisor, signal.SIGSTOP)  # alive, but answering nothing
    try:
        late = cli("stacks", job_id, "--timeout", "1", cwd=tmp_path)
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert late.returncode == 1 and late.stderr.count("\n") == 1
    assert f"job {job_id} did not answer with its stacks within 1s" in late.stderr
    # Once it runs again it answers the signal it got meanwhile, into the next numbered snapshot.
    assert wait_until(lambda: (state / "jobs" / job_id / "stacks-1.json").exists(), 30)
    assert cli("stacks", job_id, "--json", cwd=tmp_path).stdout.count('"number": 2') == 1
    stop_and_check_nothing_left(job_id, tmp_path)


def test_stacks_of_jobs_it_cannot_ask_are_one_line_errors(state, tmp_path):
    (tmp_path / "quick.py").write_text("pass\n")
    done = cli("run", "-n", "1", "quick.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    finished = cli("jobs", "--json", cwd=tmp_path)
    [record] = json.loads(finished.stdout)

    record_batch_job(
        "4242", str(tmp_path / "out.log"), 2, 1, {}, ["distlaunch", "slurm", "sbatch"], "auto", save_signal="USR1"
    )
    cases = {
        ("nope",): "no job 'nope'",
        (record["job_id"],): f"job {record['job_id']} is succeeded, not running",
        ("slurm-4242",): "job slurm-4242 is a slurm job: distlaunch stacks reaches only jobs of run and train",
    }
    for args, message in cases.items():
        r = cli("stacks", *args, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert message in r.stderr, r.stderr


def test_a_record_whose_pid_now_belongs_to_another_process_is_never_signalled(state, tmp_path):
    # A process of ours under the recorded pid, but started at another time than the record says: SIGUSR1
    # would end it (its default action), so it must come through untouched.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = Owner.me().model_copy(update={"pid": stranger.pid, "start_ticks": 1})
        write_record(JobRecord(job_id="dl-stranger", backend="local", command=[], cwd=str(tmp_path),
                               hosts=["localhost"], world_size=1, owner=owner))  # fmt: skip
        r = cli("stacks", "dl-stranger", cwd=tmp_path)
        assert r.returncode == 2 and "job dl-stranger is lost" in r.stderr, r.stderr
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
