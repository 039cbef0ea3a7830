"""Real processes on this machine: the env contract, failure and signal handling, logs, restarts."""

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import children, distlaunch_cmd, left_behind, pids_with_env, run_cli, wait_until

SCRIPTS = Path(__file__).parent / "scripts"


def script(name: str) -> str:
    return str(SCRIPTS / name)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "NO_COLOR": "1", "COLUMNS": "120", **extra}


def start(*args, **env) -> tuple[subprocess.Popen, str]:
    """Start the launcher in the background with a unique marker in every rank's environment."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(
        distlaunch_cmd(*args[:-1], "--env", f"DLTEST_MARK={mark}", args[-1]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**env),
    )
    return proc, mark


def wait_for_lines(proc: subprocess.Popen, needle: str, count: int, timeout: float = 60) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while sum(needle in line for line in lines) < count:
        assert time.monotonic() < deadline, f"timed out waiting for {needle!r}: {lines}"
        line = proc.stdout.readline()
        assert line, f"launcher ended early: {lines} {proc.stderr.read()}"
        lines.append(line)
    return lines


def test_every_rank_gets_the_torchrun_environment():
    r = run_cli(
        "run", "-n", "4", "--env", "EXTRA=a b $(x) ;ü", script("env_dump.py"), "x", "y z", "--flag", env=clean_env()
    )
    assert r.returncode == 0, r.stderr
    envs = sorted(
        (json.loads(line.split("ENV ", 1)[1]) for line in r.stdout.splitlines() if "ENV " in line),
        key=lambda e: int(e["RANK"]),
    )
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    for e in envs:
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["NODE_RANK"], e["NNODES"]) == ("4", "4", "0", "1")
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert e["DISTLAUNCH_JOB_ID"] == envs[0]["DISTLAUNCH_JOB_ID"] and e["DISTLAUNCH_JOB_ID"].startswith("dl-")
        assert e["DISTLAUNCH_PARALLEL"] == "dp=4,tp=1,pp=1,zero=0" and e["DISTLAUNCH_RESTART_COUNT"] == "0"
        assert e["OMP_NUM_THREADS"] == "1"
        assert e["EXTRA"] == "a b $(x) ;ü" and e["argv"] == ["x", "y z", "--flag"]
    assert "4 ranks exited 0" in r.stderr


def test_failing_rank_stops_the_others_and_sets_the_exit_code():
    proc, mark = start("run", "-n", "4", "--grace-period", "2", script("fail_one.py"), FAIL_RANK="2", FAIL_CODE="7")
    began = time.monotonic()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert time.monotonic() - began < 2 + 10
    assert "rank 2 on localhost exited with code 7" in err
    assert "rank 2 failing now" in err  # the root-cause table shows its last output
    assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"job processes left behind: {left}"


def test_the_rank_that_failed_first_is_the_root_cause_even_when_its_report_comes_last(tmp_path):
    crashed = tmp_path / "crashed"
    r = run_cli(
        "run", "-n", "2", "--grace-period", "1", "--json", "--env", f"CRASHED_FILE={crashed}", script("late_report.py"),
        env=clean_env(),
    )  # fmt: skip
    report = json.loads(r.stdout)
    assert r.returncode == 42 and report["exit_code"] == 42, r.stderr
    assert (report["failures"][0]["rank"], report["failures"][0]["exit_code"]) == (1, 42)
    # Nearly always rank 0's report comes first and stops the job (on a machine so loaded that rank 0 needs
    # over a second to fail, rank 1's report wins the race and rank 0 is stopped instead).
    if "rank 0 on localhost exited with code 1; stopping all ranks" in r.stderr:
        earlier = r"rank 1 on localhost exited with code 42, \d+\.\d{3}s before rank 0 did: it failed first"
        assert re.search(earlier, r.stderr), r.stderr
        assert [(f["rank"], f["exit_code"]) for f in report["failures"]] == [(1, 42), (0, 1)]
        assert report["failures"][0]["time_s"] < report["failures"][1]["time_s"]


def rank_ended(launcher: int) -> bool:
    """Whether one of the ranks under the launcher's agent has ended: it is a zombie, or already reaped."""
    ranks = [pid for agent in children(launcher) for pid in children(agent)]
    return len(ranks) < 2 or any(_state(pid) == "Z" for pid in ranks)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_rank_that_failed_before_an_interrupt_is_the_outcome(tmp_path):
    crashed = tmp_path / "crashed"
    args = ("run", "-n", "2", "--grace-period", "1", "--env", f"CRASHED_FILE={crashed}", script("late_report.py"))
    proc, mark = start(*args, PEER="waits")
    try:
        assert wait_until(crashed.exists, 30), "rank 1 never crashed"
        assert wait_until(lambda: rank_ended(proc.pid), 10), "rank 1 never ended"  # its exit, not only its file
        proc.send_signal(signal.SIGTERM)  # while rank 1's exit is still on its way to the launcher
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "received SIGTERM; stopping all ranks" in err
    assert "rank 1 on localhost exited with code 42, before the stop: it failed first (the root cause)" in err
    assert proc.returncode == 42, err
    assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"job processes left behind: {left}"


def test_an_interrupt_during_a_stop_is_answered_and_the_failure_stays_the_outcome(tmp_path):
    prog = tmp_path / "slow_to_stop.py"  # rank 0 ignores SIGTERM: the stop after rank 1's failure takes the grace
    prog.write_text(
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    time.sleep(600)\n"
        "time.sleep(0.5)\n"
        "sys.exit(5)\n"
    )
    proc, mark = start("run", "-n", "2", "--grace-period", "4", str(prog))
    try:
        seen = ""
        while "stopping all ranks" not in seen:
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "received SIGINT; already stopping all ranks (a second Ctrl-C kills them at once)" in err, seen + err
    assert proc.returncode == 5, err
    assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"job processes left behind: {left}"


def test_a_launcher_frozen_past_the_heartbeat_timeout_never_reports_success(tmp_path):
    """The agents stop the ranks of a launcher they no longer hear (a suspended laptop, SIGSTOP); when it
    wakes up, the job failed (exit 3, saying why), not "finished", and no healthy host is blamed as silent."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import os, time\nprint('up', os.environ['RANK'], flush=True)\ntime.sleep(60)\n")
    proc, mark = start("run", "-n", "2", "--heartbeat-timeout", "3", "--grace-period", "1", str(sleeper))
    try:
        wait_for_lines(proc, "up", 2)
        proc.send_signal(signal.SIGSTOP)
        assert not (left := left_behind("DLTEST_MARK", mark, 30)), f"the agent kept the ranks: {left}"
        proc.send_signal(signal.SIGCONT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert "stopped its ranks on its own: it heard nothing from this launcher" in err, err
    assert "finished" not in err and "has been silent" not in err, err


def test_the_failure_table_shows_the_first_failures_and_counts_the_rest(tmp_path):
    def run_all_fail(*extra: str):
        barrier = tmp_path / f"barrier{len(extra)}"
        barrier.mkdir()
        args = ("run", "-n", "10", "--grace-period", "1", "--env", f"BARRIER_DIR={barrier}", *extra)
        return run_cli(*args, script("all_fail.py"), env=clean_env())

    r = run_all_fail()
    assert r.returncode == 3, r.stderr
    rows = [line for line in r.stderr.splitlines() if "│ localhost │ 3 " in line]
    assert len(rows) == 8, r.stderr
    assert re.search(r"^2 more ranks failed after those \(\d[,-]\d\): --json lists every failure", r.stderr, re.M)
    report = json.loads(run_all_fail("--json").stdout)
    assert sorted(f["rank"] for f in report["failures"]) == list(range(10))


def test_rank_killed_by_a_signal_reports_128_plus_n():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    r = run_cli("run", "-n", "2", "--grace-period", "1", "--no-python", "python", "-c", code, env=clean_env())
    assert r.returncode == 128 + 9, r.stderr
    assert "was killed by SIGKILL" in r.stderr and "137 (SIGKILL)" in r.stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_every_rank_even_stubborn_ones(sig, code):
    proc, mark = start("run", "-n", "2", "--grace-period", "1", script("stubborn.py"))
    wait_for_lines(proc, "ready", 2)
    # two ranks, each with a child (a loaded machine may list a just-started child a moment later)
    assert wait_until(lambda: len(pids_with_env("DLTEST_MARK", mark)) >= 4, 10)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == code
    assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"a rank or its child survived: {left}"


def test_ranks_die_when_the_launcher_is_killed():
    proc, mark = start("run", "-n", "3", "--grace-period", "1", script("stubborn.py"))
    wait_for_lines(proc, "ready", 3)
    proc.kill()  # SIGKILL: the launcher gets no chance to clean up; the agent must
    proc.wait()
    assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"ranks outlived a SIGKILLed launcher: {left}"


def test_lines_are_whole_and_never_mixed(tmp_path):
    r = run_cli("run", "-n", "4", "--log-dir", str(tmp_path), script("chatty.py"), "1500", env=clean_env())
    assert r.returncode == 0, r.stderr
    pattern = re.compile(r"^\[rank (\d)\] R\1-(\d{5}-\1{300}|tail-without-newline)$")
    lines = r.stdout.splitlines()
    assert len(lines) == 4 * 1501
    assert all(pattern.match(line) for line in lines), next(line for line in lines if not pattern.match(line))
    (job,) = tmp_path.iterdir()
    for rank in range(4):
        logged = [ln.split("| ", 1)[1] for ln in (job / f"rank{rank}.log").read_text().splitlines() if "| " in ln]
        assert len(logged) == 1501 and logged[0] == f"R{rank}-00000-" + str(rank) * 300


def test_log_dir_keeps_one_folder_per_job_with_stamped_lines_and_restart_marks(tmp_path):
    for _ in range(2):  # two jobs into the same --log-dir never share a file
        r = run_cli(
            "run",
            "-n",
            "2",
            "--max-restarts",
            "1",
            "--local-ranks-filter",
            "1",
            "--log-dir",
            str(tmp_path),
            script("restart.py"),
            env=clean_env(),
        )
        assert r.returncode == 0, r.stderr
        assert "[rank 0]" not in r.stdout and "[rank 1]" in r.stdout  # the terminal shows local rank 1 only
    jobs = sorted(tmp_path.iterdir())
    assert len(jobs) == 2 and all(j.name.startswith("dl-") for j in jobs)
    for job in jobs:
        text = (job / "rank0.log").read_text()  # rank 0 was hidden on the terminal, kept in its file
        assert text.startswith(f"# distlaunch job {job.name}: rank 0 (local rank 0) on localhost, started 20")
        assert "# command: " in text and "restart.py" in text and "# plan: world_size=2" in text
        assert "# --- restart 1, 20" in text
        lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
        assert lines and all(re.match(r"^20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (out|err)\| ", ln) for ln in lines)
        assert any("try 1" in ln for ln in lines)


def test_max_restarts_restarts_the_group_with_the_count():
    r = run_cli("run", "-n", "2", "--max-restarts", "1", script("restart.py"), env=clean_env())
    assert r.returncode == 0, r.stderr
    assert "restarting the job (1/1)" in r.stderr and "try 1" in r.stdout and "after 1 restart" in r.stderr
    r = run_cli("run", "-n", "2", script("restart.py"), env=clean_env())
    assert r.returncode == 3


def test_torchrun_script_runs_unchanged_with_real_gloo_allreduce():
    r = run_cli("run", "-n", "4", "-m", "distlaunch.examples.allreduce", env=clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("all_reduce(sum of rank+1) = 10 (ok)") == 4


def test_help_and_dry_run_never_import_torch(tmp_path):
    code = (
        "import sys; from distlaunch.cli.app import main; main(['--help']); "
        "main(['run', '-n', '2', '--dry-run', '--json', 'x.py']); print('TORCH', 'torch' in sys.modules)"
    )
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "TORCH False" in r.stdout


def test_rank_output_that_looks_like_markup_is_printed_as_it_is(tmp_path):
    script = tmp_path / "gloo_like.py"
    script.write_text(
        "import sys\n"
        "print('[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144] Connection refused', file=sys.stderr)\n"
        "print('[bold]not bold[/bold] [/]', file=sys.stderr)\n"
        "sys.exit(6)\n"
    )
    r = run_cli("run", "-n", "1", str(script), "[x]", cwd=tmp_path)
    assert r.returncode == 6, r.stderr
    assert "internal error" not in r.stderr
    assert "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:144]" in r.stderr  # in the root-cause table
    dry = run_cli("run", "-n", "1", "--dry-run", str(script), "[/x]", cwd=tmp_path)
    assert dry.returncode == 0 and "[/x]" in dry.stdout
