"""The job registry end to end: real detached jobs (local and over the test sshd), their records, output and stop.

Every test has a state directory of its own (DISTLAUNCH_STATE_DIR). A job's processes are found by
DISTLAUNCH_JOB_ID in /proc/*/environ, never by name."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import distlaunch_cmd, pids_with_env, run_cli, wait_until

TICKER = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    for i in range(int(sys.argv[1])):
        print(f"tick {i} of rank {rank}", flush=True)
        time.sleep(0.1)
    print(f"rank {rank} says goodbye on stderr", file=sys.stderr)
    sys.exit(int(sys.argv[2]) if rank == 1 else 0)
    """
)


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A private state directory; the CLI subprocesses inherit it."""
    d = tmp_path / "state"
    monkeypatch.setenv("DISTLAUNCH_STATE_DIR", str(d))
    (tmp_path / "ticker.py").write_text(TICKER)
    return d


@contextlib.contextmanager
def following(job_id: str, cwd) -> Iterator[subprocess.Popen]:
    """``distlaunch logs JOB --follow`` running beside the test (killed if the test leaves it running)."""
    follower = subprocess.Popen(
        distlaunch_cmd("logs", job_id, "--follow"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    try:
        yield follower
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()


def cli(*args: str, cwd, timeout: float = 60):
    return run_cli(*args, cwd=cwd, timeout=timeout, env={"DISTLAUNCH_STATE_DIR": os.environ["DISTLAUNCH_STATE_DIR"]})


def jobs_json(cwd, *args: str) -> list[dict]:
    r = cli("jobs", "--json", *args, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def status_json(job_id: str, cwd) -> dict:
    r = cli("status", job_id, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_state(job_id: str, cwd, states: tuple[str, ...], timeout: float = 60) -> dict:
    seen = {}

    def ended() -> bool:
        seen.update(status_json(job_id, cwd))
        return seen["state"] in states

    assert wait_until(ended, timeout, interval=0.3), f"job {job_id} stayed {seen.get('state')}"
    return seen


def test_detached_job_is_listed_followed_and_stopped_with_nothing_left(state, tmp_path):
    r = cli("run", "-n", "2", "--detach", "--grace-period", "2", "ticker.py", "100000", "0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert job_id.startswith("dl-") and "runs in the background" in r.stderr
    assert wait_until(lambda: len(pids_with_env("DISTLAUNCH_JOB_ID", job_id)) >= 2, 30)

    listed = jobs_json(tmp_path, "--running")
    assert [(j["job_id"], j["state"], j["world_size"], j["backend"]) for j in listed] == [
        (job_id, "running", 2, "local")
    ]
    assert "--detach" in listed[0]["command"]

    # A unique prefix is enough; the output is the job's, rank-prefixed, and --rank keeps one rank's lines.
    assert wait_until(lambda: "tick 3 of rank 1" in cli("logs", job_id[:6], cwd=tmp_path).stdout, 30)
    one = cli("logs", job_id[:6], "--rank", "1", "--tail", "2", cwd=tmp_path).stdout.splitlines()
    assert len(one) == 2 and all(line.startswith("[rank 1] tick ") for line in one)

    stopped = cli("stop", job_id, "--json", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    record = json.loads(stopped.stdout)
    assert (record["state"], record["exit_code"]) == ("stopped", 143)
    assert wait_until(lambda: not pids_with_env("DISTLAUNCH_JOB_ID", job_id), 10)
    assert "interrupted by SIGTERM" in cli("logs", job_id, cwd=tmp_path).stdout
    assert jobs_json(tmp_path, "--running") == []


def test_logs_follow_prints_until_the_job_ends(state, tmp_path):
    job_id = cli("run", "-n", "2", "--detach", "ticker.py", "30", "0", cwd=tmp_path).stdout.strip()
    followed = cli("logs", job_id, "--follow", "--rank", "0", cwd=tmp_path, timeout=120)
    assert followed.returncode == 0
    assert followed.stdout.splitlines()[-2:] == ["[rank 0] tick 29 of rank 0", "[rank 0] rank 0 says goodbye on stderr"]
    assert status_json(job_id, tmp_path)["state"] == "succeeded"
    errors = cli("logs", job_id, "--stderr", cwd=tmp_path).stdout.splitlines()
    assert errors[0] == f"distlaunch: job {job_id}: starting 2 ranks on this machine"  # notices are kept there too
    assert sorted(errors[1:]) == ["[rank 0] rank 0 says goodbye on stderr", "[rank 1] rank 1 says goodbye on stderr"]


def test_a_follower_sees_a_truncation_after_which_the_file_grew_past_its_old_end(tmp_path):
    """Between two looks of a follower, the file was emptied and written past the point the follower had read to (a
    fast writer, a busy machine): its size alone says nothing, the bytes it read last are no longer there."""
    from distlaunch.backends.output import Note, file_lines
    from distlaunch.jobs.store import JobRecord

    path = tmp_path / "output.log"
    path.write_text("".join(f"[rank 0] tick {i}\n" for i in range(10)))
    before = path.stat().st_size

    def rewrite_then_say_running(record):  # the follower found nothing new: between this look and the next one
        if path.stat().st_size == before:
            os.truncate(path, 0)
            with open(path, "a") as f:
                f.write("".join(f"[rank 0] after {i}\n" for i in range(20)))
            assert path.stat().st_size > before
        return record

    record = JobRecord(job_id="dl-follow", backend="local", command=[], cwd=str(tmp_path), hosts=[], world_size=1)
    lines = file_lines(record, path, follow=True, keep=lambda line: True, tail=None, reread=rewrite_then_say_running)
    assert [next(lines) for _ in range(10)][-1] == "[rank 0] tick 9"
    note = next(lines)
    assert isinstance(note, Note) and note == f"{path} was truncated; following it from its new start"
    assert [next(lines) for _ in range(20)] == [f"[rank 0] after {i}" for i in range(20)]


def test_logs_follow_goes_on_when_the_output_file_is_truncated_under_it(state, tmp_path):
    """A long job's output.log emptied to free its disk (by hand, or logrotate's copytruncate): the job appends
    from the new start, and a follower waiting at its old end printed nothing more until the file grew past it,
    then from the middle of a line. It says so in one line and follows from the new start."""
    job_id = cli("run", "-n", "1", "--detach", "ticker.py", "100000", "0", cwd=tmp_path).stdout.strip()
    output = state / "jobs" / job_id / "output.log"
    with following(job_id, tmp_path) as follower:
        # the follower has the file open and has read past tick 40 (a follower still starting when the file is
        # emptied has nothing to notice: on a loaded machine its start takes seconds)
        for line in follower.stdout:
            if "tick 40 of rank 0" in line:
                break
        else:
            raise AssertionError(follower.stderr.read())
        before = output.stat().st_size
        os.truncate(output, 0)
        assert wait_until(lambda: output.stat().st_size > before // 2, 30)  # ticks written since, not yet past
        assert cli("stop", job_id, cwd=tmp_path).returncode == 0
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert err == f"distlaunch: {output} was truncated; following it from its new start\n", err
    since = [line for line in output.read_text().splitlines() if "] tick " in line]
    assert since and set(since) <= set(out.splitlines()), out[-500:]  # every tick written after the truncation


def test_a_failed_detached_job_shows_the_failing_rank_in_status(state, tmp_path):
    job_id = cli("run", "-n", "2", "--detach", "ticker.py", "5", "7", cwd=tmp_path).stdout.strip()
    record = wait_state(job_id, tmp_path, ("failed",))
    assert record["exit_code"] == 7
    assert record["report"]["failures"][0]["rank"] == 1
    shown = cli("status", job_id, cwd=tmp_path)
    assert "failed" in shown.stdout and "rank 1 exit 7" in shown.stdout and "tick 4 of rank 1" in shown.stdout


def test_a_killed_supervisor_takes_its_ranks_and_the_job_shows_as_lost(state, tmp_path):
    job_id = cli("run", "-n", "2", "--detach", "ticker.py", "100000", "0", cwd=tmp_path).stdout.strip()
    assert wait_until(lambda: len(pids_with_env("DISTLAUNCH_JOB_ID", job_id)) >= 2, 30)
    owner = status_json(job_id, tmp_path)["owner"]["pid"]
    reserve = state / "jobs" / job_id / ".reserve"  # the room its last record would have taken
    assert reserve.stat().st_blocks * 512 >= 1 << 20
    os.kill(owner, signal.SIGKILL)
    assert wait_until(lambda: not pids_with_env("DISTLAUNCH_JOB_ID", job_id), 10)
    assert status_json(job_id, tmp_path)["state"] == "lost"
    assert not reserve.exists()  # of no use to anyone now: given back once the job is seen lost
    assert "lost" in cli("jobs", cwd=tmp_path).stdout
    stop = cli("stop", job_id, cwd=tmp_path)
    assert stop.returncode == 2 and "is lost, not running" in stop.stderr


def test_logs_follow_of_a_job_that_is_lost_says_so(state, tmp_path):
    job_id = cli("run", "-n", "2", "--detach", "ticker.py", "100000", "0", cwd=tmp_path).stdout.strip()
    with following(job_id, tmp_path) as follower:
        assert wait_until(lambda: "tick 3 of rank 1" in cli("logs", job_id, cwd=tmp_path).stdout, 30)
        owner = status_json(job_id, tmp_path)["owner"]
        os.kill(owner["pid"], signal.SIGKILL)
        out, err = follower.communicate(timeout=60)
    assert "tick 3 of rank 1" in out
    # one line, and exit 0 as for any job that has ended: logs says whether the output could be shown,
    # status how the job ended
    assert follower.returncode == 0 and err.count("\n") == 1, err
    assert err == (
        f"distlaunch: job {job_id} was lost: the process that ran the job (pid {owner['pid']} on "
        f"{owner['hostname']}) is gone; its output ends here (see 'distlaunch status {job_id}')\n"
    )
    again = cli("logs", job_id, "--follow", "--tail", "1", cwd=tmp_path)  # already lost: the same line
    assert again.returncode == 0 and "was lost" in again.stderr


def test_foreground_jobs_are_recorded_and_a_corrupt_record_breaks_nothing(state, tmp_path):
    assert cli("run", "-n", "2", "ticker.py", "1", "3", cwd=tmp_path).returncode == 3
    assert cli("run", "-n", "1", "ticker.py", "1", "0", cwd=tmp_path).returncode == 0
    ok, failed = jobs_json(tmp_path)
    assert (ok["state"], ok["exit_code"], failed["state"], failed["exit_code"]) == ("succeeded", 0, "failed", 3)
    assert ok["created_at"] >= failed["created_at"]  # newest first

    (state / "jobs" / failed["job_id"] / "job.json").write_text('{"job_id": "dl-')  # half a record
    listed = jobs_json(tmp_path)
    assert [j["job_id"] for j in listed] == [ok["job_id"], failed["job_id"]]
    assert listed[1]["problem"].startswith("job.json is not a job record: not JSON (")
    assert "unreadable" in cli("jobs", cwd=tmp_path).stdout
    bad = cli("status", failed["job_id"], cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "is not a job record: not JSON" in bad.stderr

    logs = cli("logs", ok["job_id"], cwd=tmp_path)  # run in a terminal: read back from its rank logs
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["[rank 0] tick 0 of rank 0", "[rank 0] rank 0 says goodbye on stderr"]


def test_job_id_prefixes_must_be_unique_and_known(state, tmp_path):
    for _ in range(2):
        assert cli("run", "-n", "1", "ticker.py", "1", "0", cwd=tmp_path).returncode == 0
    ambiguous = cli("status", "dl-", cwd=tmp_path)
    assert ambiguous.returncode == 2 and "ambiguous" in ambiguous.stderr
    unknown = cli("status", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "no job 'nope'" in unknown.stderr and "distlaunch jobs --all" in unknown.stderr


def test_an_unwritable_state_directory_costs_the_record_not_the_job(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DISTLAUNCH_STATE_DIR", str(blocker / "state"))  # a folder under a file cannot exist
    (tmp_path / "ticker.py").write_text(TICKER)
    r = cli("run", "-n", "1", "ticker.py", "1", "0", cwd=tmp_path)
    assert r.returncode == 0
    assert "cannot record job" in r.stderr and "DISTLAUNCH_STATE_DIR" in r.stderr


def test_bad_input_fails_before_detaching(state, tmp_path):
    r = cli("run", "-n", "2", "--detach", "missing.py", cwd=tmp_path)
    assert r.returncode == 2 and "missing.py" in r.stderr
    assert jobs_json(tmp_path, "--all") == []


def test_a_detach_that_cannot_start_says_why_in_one_line_and_leaves_nothing(state, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    nowhere = str(tmp_path / "nowhere")
    cases = [  # (environment, options, what is wrong, how to fix it)
        ({"DISTLAUNCH_STATE_DIR": str(blocker / "state")}, [], f"in {blocker}/state/jobs: Not a directory",
         "set DISTLAUNCH_STATE_DIR to a writable folder"),
        ({}, ["--workdir", nowhere], f"working directory {nowhere!r} does not exist", "existing directory"),
        ({}, ["--workdir", str(blocker)], f"working directory {str(blocker)!r} is not a directory", "--workdir"),
    ]  # fmt: skip
    for env, args, wrong, fix in cases:
        r = run_cli("run", "-n", "2", "--detach", *args, "ticker.py", "1", "0", cwd=tmp_path, env=env)
        assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1), r.stderr
        assert wrong in r.stderr and "(hint: " in r.stderr and fix in r.stderr, r.stderr
    assert not (state / "jobs").exists() or not any((state / "jobs").iterdir())  # no folder without job.json
    assert jobs_json(tmp_path, "--all") == []
    # The foreground run refuses the same working directory the same way (it used to fail every rank with 127).
    r = cli("run", "-n", "2", "--workdir", str(tmp_path / "nowhere"), "ticker.py", "1", "0", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr


def test_a_supervisor_that_dies_before_its_record_takes_its_folder_with_it(state, tmp_path, monkeypatch):
    from distlaunch.contract.options import ExecOptions, LaunchOptions
    from distlaunch.errors import DistlaunchError
    from distlaunch.launcher.running import detach as supervisor
    from distlaunch.launcher.running.launch import plan_for

    monkeypatch.chdir(tmp_path)
    opts = LaunchOptions(program=["ticker.py", "1", "0"], nproc_per_node=1)
    launch = supervisor.DetachedLaunch(plan=plan_for(opts), opts=opts, exec_opts=ExecOptions(), command=[])
    monkeypatch.setattr(supervisor.sys, "executable", "/bin/false")  # the supervisor ends at once, recording nothing
    with pytest.raises(DistlaunchError, match="did not start") as failed:
        supervisor.detach(launch)
    assert failed.value.exit_code == 1
    assert not (state / "jobs" / launch.plan.job_id).exists()


def test_detached_job_over_ssh_is_listed_and_stopped(state, tmp_path, sshd_cluster):
    args = ["-H", str(sshd_cluster.hostfile), "--ssh-config", str(sshd_cluster.ssh_config)]
    script = str(tmp_path / "ticker.py")
    r = cli("run", *args, "--detach", "--grace-period", "1", script, "100000", "0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    record = status_json(job_id, tmp_path)
    assert record["backend"] == "ssh" and record["world_size"] == 6
    assert wait_until(lambda: len(pids_with_env("DISTLAUNCH_JOB_ID", job_id)) >= 6, 60)
    assert wait_until(lambda: "[node3 rank 5] tick" in cli("logs", job_id, cwd=tmp_path).stdout, 60)
    assert json.loads(cli("stop", job_id, "--json", cwd=tmp_path).stdout)["state"] == "stopped"
    assert wait_until(lambda: not pids_with_env("DISTLAUNCH_JOB_ID", job_id), 15)


def test_state_directory_follows_the_documented_order(tmp_path):
    from distlaunch.jobs.store import state_dir

    home = str(tmp_path)
    assert state_dir({"DISTLAUNCH_STATE_DIR": "/a", "XDG_STATE_HOME": "/b"}) == Path("/a")
    assert state_dir({"XDG_STATE_HOME": "/b"}) == Path("/b/distlaunch")
    assert state_dir({"HOME": home}) == Path.home() / ".local" / "state" / "distlaunch"


def test_closing_the_terminal_of_a_foreground_job_stops_it_and_says_so(state, tmp_path):
    proc = subprocess.Popen(
        distlaunch_cmd("run", "-n", "2", "--grace-period", "2", "ticker.py", "100000", "0"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    assert "tick" in proc.stdout.readline()
    [job] = jobs_json(tmp_path, "--running")
    os.killpg(proc.pid, signal.SIGHUP)  # what a closing terminal does: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 129
    assert "the terminal was closed (SIGHUP)" in err
    assert not pids_with_env("DISTLAUNCH_JOB_ID", job["job_id"])
    assert status_json(job["job_id"], tmp_path)["state"] == "interrupted"


def test_a_job_under_nohup_outlives_its_terminal(state, tmp_path):
    proc = subprocess.Popen(
        ["nohup", *distlaunch_cmd("run", "-n", "2", "ticker.py", "20", "0")],  # nohup: SIGHUP ignored
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        start_new_session=True,
    )
    assert "tick" in proc.stdout.readline()
    os.killpg(proc.pid, signal.SIGHUP)  # the terminal closes
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "tick 19 of rank 0" in out and "tick 19 of rank 1" in out
    assert "SIGHUP" not in err


def _record(job_id: str, age_s: float = 0.0):
    """A finished local job's record, written as a launcher would have."""
    import time

    from distlaunch.jobs.store import JobRecord, write_record

    write_record(
        JobRecord(job_id=job_id, backend="local", command=["distlaunch", "run"], cwd="/", hosts=["localhost"],
                  world_size=2, state="succeeded", exit_code=0, created_at=time.time() - age_s)
    )  # fmt: skip


def test_unreadable_records_keep_the_jobs_table_readable_and_are_always_listed(state, tmp_path):
    good = [f"dl-{i:012x}" for i in range(1, 23)]  # more than the 20 that 'jobs' shows
    for age, job_id in enumerate(good):
        _record(job_id, age_s=age)
    jobs = state / "jobs"
    (jobs / "dl-badbadbadbad").mkdir()
    (jobs / "dl-badbadbadbad" / "job.json").write_text("garbled by hand\n")
    (jobs / "dl-bad0shape000").mkdir()
    (jobs / "dl-bad0shape000" / "job.json").write_text('{"job_id": "dl-bad0shape000"}')
    (jobs / "dl-bad0missing0").mkdir()
    os.utime(jobs / "dl-bad0missing0", (1, 1))  # long past any supervisor's start
    (jobs / "dl-bad0starting").mkdir()  # a detached job whose supervisor writes its record any moment now
    reasons = {
        "dl-badbadbadbad": "job.json is not a job record: not JSON (expected value at line 1 column 1)",
        "dl-bad0shape000": "job.json is not a job record: backend is missing (and 4 more)",
        "dl-bad0missing0": "job.json is missing",
    }

    for args in ([], ["--all"]):
        table = run_cli("jobs", *args, cwd=tmp_path, env={"COLUMNS": "80"}).stdout.splitlines()
        assert table[0].split() == ["JOB", "BACKEND", "HOSTS", "RANKS", "STATE", "AGE", "EXIT"]
        rows = [line.split() for line in table[1:] if line.startswith("dl-") and ":" not in line]
        assert [row[0] for row in rows] == good[: None if args else 20] + sorted(reasons)  # never cut short
        assert all(row[1:] == ["local", "localhost", "2", "succeeded", row[5], "0"] for row in rows[:-3])
        assert [row[1:] for row in rows[-3:]] == [["unreadable"]] * 3
        assert [line for line in table if ": job.json" in line] == [f"{k}: {v}" for k, v in sorted(reasons.items())]
        assert "validation error" not in "\n".join(table) and "dl-bad0starting" not in "\n".join(table)

    listed = jobs_json(tmp_path)  # scripts see them too, with the reason
    assert [j for j in listed if j["state"] == "unreadable"] == [
        {"job_id": k, "state": "unreadable", "problem": v} for k, v in sorted(reasons.items())
    ]
    assert len(listed) == 20 + 3


def test_logs_refuses_a_rank_the_job_does_not_have(state, tmp_path):
    job_id = cli("run", "-n", "2", "--detach", "ticker.py", "1", "0", cwd=tmp_path).stdout.strip()
    wait_state(job_id, tmp_path, ("succeeded",))
    r = cli("logs", job_id, "--rank", "1", "--rank", "5", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr.count("\n")) == (2, "", 1)
    assert f"job {job_id} has no rank 5: its ranks are 0-1" in r.stderr
    assert cli("logs", job_id, "--rank", "1", cwd=tmp_path).stdout.startswith("[rank 1] tick 0 of rank 1")


STUBBORN = textwrap.dedent(
    """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring SIGTERM", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_stop_that_outlasts_its_timeout_is_exit_1_as_stacks_and_the_job_still_stops(state, tmp_path):
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    r = cli("run", "-n", "2", "--detach", "--grace-period", "3", "stubborn.py", cwd=tmp_path)
    job_id = r.stdout.strip()
    assert wait_until(lambda: cli("logs", job_id, cwd=tmp_path).stdout.count("ignoring SIGTERM") == 2, 30)
    late = cli("stop", job_id, "--timeout", "1", cwd=tmp_path)
    assert (late.returncode, late.stderr.count("\n")) == (1, 1), late.stderr  # not 2: the command was fine
    assert f"job {job_id} did not confirm its end within 1s" in late.stderr and "--timeout" in late.stderr
    assert wait_state(job_id, tmp_path, ("stopped",))["exit_code"] == 143  # SIGKILL after the grace period
    assert wait_until(lambda: not pids_with_env("DISTLAUNCH_JOB_ID", job_id), 10)


def test_logs_follow_waits_for_the_supervisor_to_write_its_report_after_the_end(state, tmp_path):
    """A detached job's supervisor records the end, then prints the failure report into the output: a follow
    that stopped at the record missed the report (the supervisor here: a real process we hold open)."""
    import time

    from distlaunch.jobs.store import JobRecord, Owner, _start_ticks, jobs_dir, write_record

    writer = subprocess.Popen(["sleep", "60"])
    try:
        job_id = "dl-00000000beef"
        owner = Owner(pid=writer.pid, start_ticks=_start_ticks(writer.pid), hostname=os.uname().nodename)
        write_record(
            JobRecord(job_id=job_id, backend="local", command=["distlaunch", "run"], cwd="/", hosts=["localhost"],
                      world_size=2, state="failed", exit_code=7, created_at=time.time(), owner=owner)
        )  # fmt: skip
        output = jobs_dir() / job_id / "output.log"
        output.write_text("[rank 1] boom\n")
        with following(job_id, None) as follow:
            time.sleep(2)
            assert follow.poll() is None, follow.communicate()  # the job has ended, its writer has not
            with output.open("a") as f:
                f.write("job dl-00000000beef failed (root cause first)\n")
            writer.kill()
            writer.wait()
            out, err = follow.communicate(timeout=30)
        assert follow.returncode == 0, err  # as for any end ('status' says how it ended)
        assert out.splitlines()[:2] == ["[rank 1] boom", "job dl-00000000beef failed (root cause first)"], out
    finally:
        writer.kill()
        writer.wait()


def test_the_record_the_status_and_the_report_keep_what_each_host_reported_of_itself(state, tmp_path):
    """The inventory the hosts gave before their ranks started (this machine's, for a local job): in the job's
    record, as two columns of ``status``, and in the report of ``run --json``."""
    done = cli("run", "-n", "2", "--json", "ticker.py", "1", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    here = report["hosts"]["localhost"]
    assert here["cpus"] == os.cpu_count() and here["gpus"] == [], here
    (record,) = [j for j in jobs_json(tmp_path) if j["job_id"] == report["job_id"]]
    assert record["plan"]["decisions"]["inventories"]["localhost"]["cpus"] == os.cpu_count()
    status = cli("status", report["job_id"], cwd=tmp_path).stdout
    header = next(line for line in status.splitlines() if line.startswith("HOST"))
    assert header.split() == ["HOST", "NODE", "RANKS", "STATE", "GPUS", "CPUS"], status
    row = next(line for line in status.splitlines() if line.startswith("localhost"))
    assert row.split()[-2:] == ["none", str(os.cpu_count())], status
