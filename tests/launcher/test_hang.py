"""A real hang with real gloo: one of 4 ranks sleeps before an all_reduce; the launcher names it."""

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from distlaunch.launcher.supervising.stacks import group_stacks, summary
from tests.fixtures import require
from tests.helpers import distlaunch_cmd, left_behind, wait_until
from tests.launcher.scripts.nccl_dumper import dump_bytes

LATE = str(Path(__file__).parent / "scripts" / "late_rank.py")
DUMPER = str(Path(__file__).parent / "scripts" / "nccl_dumper.py")


def path_without(tool: str) -> str:
    """$PATH less every folder that holds ``tool``."""
    path = os.environ["PATH"]
    while found := shutil.which(tool, path=path):
        path = os.pathsep.join(
            d for d in path.split(os.pathsep) if d and Path(d).resolve() != Path(found).parent.resolve()
        )
    return path


def installed_pyspy() -> str:
    """py-spy as the test extras install it: on PATH, or in this interpreter's scripts folder (a virtual
    environment used without activating it)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))
    require(None if found else "py-spy not found: pip install -e '.[test]'")
    return found


def test_a_rank_that_never_joins_the_all_reduce_is_named_and_the_job_exits_124(tmp_path):
    """Stacks by py-spy, as where it is installed (the test extras install it)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PATH"] = f"{Path(installed_pyspy()).parent}{os.pathsep}{env['PATH']}"  # the agent looks for it on PATH
    env.update(NO_COLOR="1", COLUMNS="200", LATE_RANK="3", DLTEST_MARK=tmp_path.name)
    r = subprocess.run(
        distlaunch_cmd(
            "run", "-n", "4", "--hang-timeout", "20", "--grace-period", "1", "--log-dir", str(tmp_path / "logs"), LATE
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert r.returncode == 124, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("distlaunch: hang: "))
    assert re.search(r"ranks 0-2 wait in all_reduce \(late_rank\.py:30\)", line), line
    assert re.search(r"rank 3 in <module> \(late_rank\.py:28\) on localhost", line), line
    folders = list((tmp_path / "logs").glob("dl-*/stacks"))
    assert len(folders) == 1
    stacks = {p.name: p.read_text() for p in folders[0].iterdir()}
    assert sorted(stacks) == ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]
    assert stacks["rank3.txt"].startswith("# rank 3 on localhost (py-spy)\n"), stacks["rank3.txt"]
    assert f"<module> ({LATE}:28)" in stacks["rank3.txt"]  # py-spy's full filename
    assert "all_reduce" in stacks["rank0.txt"]
    assert "finished" not in r.stdout + r.stderr  # a hung job is reported hung, not finished
    assert not (left := left_behind("DLTEST_MARK", tmp_path.name, 10)), f"ranks left behind: {left}"


# four ranks, no torch (quick to start): each naps in a function of its own
NAPPER = "import time\nprint('in place', flush=True)\ndef nap():\n    while True:\n        time.sleep(0.2)\nnap()\n"


@pytest.mark.parametrize("pyspy", ["absent", "never-answers"])
def test_without_a_working_py_spy_every_rank_sends_its_faulthandler_stack(tmp_path, pyspy):
    """py-spy not installed, or stuck (it cannot attach, say) on every rank: the dumps run side by side
    and are given up together, so the agent keeps answering heartbeats and every stack arrives in time."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PATH=path_without("py-spy"), NO_COLOR="1", COLUMNS="200", DLTEST_MARK=tmp_path.name)
    if pyspy == "never-answers":
        stuck = tmp_path / "bin"
        stuck.mkdir()
        (stuck / "py-spy").write_text("#!/bin/sh\nexec sleep 600\n")
        (stuck / "py-spy").chmod(0o755)
        env["PATH"] = f"{stuck}{os.pathsep}{env['PATH']}"
    (tmp_path / "napper.py").write_text(NAPPER)
    logs = tmp_path / "logs"
    argv = ["run", "-n", "4", "--hang-timeout", "3", "--grace-period", "1", "--log-dir", str(logs), "napper.py"]
    r = subprocess.run(distlaunch_cmd(*argv), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 124, r.stderr  # not 3: the host never went silent
    hang = [ln for ln in r.stderr.splitlines() if ln.startswith("distlaunch: hang: ")]
    assert hang == ["distlaunch: hang: ranks 0-3 wait in nap (napper.py:5)"], r.stderr
    (folder,) = logs.glob("dl-*/stacks")
    heads = sorted(p.read_text().splitlines()[0] for p in folder.iterdir())
    assert heads == [f"# rank {r} on localhost (faulthandler)" for r in range(4)]
    assert 'napper.py", line 5 in nap' in (folder / "rank0.txt").read_text()
    assert not (left := left_behind("DLTEST_MARK", tmp_path.name, 10)), f"ranks or dumps left behind: {left}"


WAITER = "import threading\nprint('waiting', flush=True)\nthreading.Event().wait(60)\n"


def test_a_dump_by_py_spy_and_one_by_faulthandler_of_the_same_place_are_one_group(tmp_path):
    """Hosts with and without py-spy in one job: the same waiting place must not look like two."""
    pyspy = installed_pyspy()
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    dump_file = tmp_path / "faulthandler.txt"
    code = f"import faulthandler, signal, runpy; faulthandler.register(signal.SIGUSR1, open({str(dump_file)!r}, 'w')); runpy.run_path({str(script)!r}, run_name='__main__')"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(0.5)  # into the wait
        by_pyspy = subprocess.run(
            [pyspy, "dump", "--full-filenames", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30
        ).stdout
        proc.send_signal(signal.SIGUSR1)
        assert wait_until(lambda: "waiter.py" in dump_file.read_text(), 10)  # the whole stack, down to the script
    finally:
        proc.kill()  # our own child
        proc.wait()
    assert "Condition.wait" in by_pyspy, by_pyspy
    groups = group_stacks({0: by_pyspy, 1: dump_file.read_text()}, {0: "node1", 1: "node2"})
    assert [(g.ranks, g.where) for g in groups] == [([0, 1], "wait (waiter.py:3)")]


def test_grouping_names_the_odd_ranks_out_with_their_host():
    def dump(func: str, line: int) -> str:
        return f'Thread 0x1 (most recent call first):\n  File "/x/y.py", line {line} in {func}\n'

    stacks = {r: dump("all_reduce", 42) for r in (0, 1, 2, 4, 5, 6, 7)} | {3: dump("<module>", 40)}
    hosts = {r: f"node{r // 4 + 1}" for r in range(8)}
    text = summary(group_stacks(stacks, hosts))
    assert text == "ranks 0-2,4-7 wait in all_reduce (y.py:42); rank 3 in <module> (y.py:40) on node1"


def test_nccl_flight_recorder_dumps_reach_the_job_folder_byte_for_byte(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(NO_COLOR="1", COLUMNS="300", DLTEST_MARK=tmp_path.name)
    logs = tmp_path / "logs"
    r = subprocess.run(
        distlaunch_cmd("run", "-n", "4", "--hang-timeout", "3", "--grace-period", "1", "--log-dir", str(logs), DUMPER),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 124, r.stderr
    (folder,) = logs.glob("dl-*/stacks")
    names = sorted(p.name for p in folder.iterdir())
    assert names == [*(f"nccl_trace_rank_{r}" for r in range(3)), *(f"rank{r}.txt" for r in range(4))], names
    assert (folder / "nccl_trace_rank_0").read_bytes() == dump_bytes(0)  # written before the hang
    assert (folder / "nccl_trace_rank_1").read_bytes() == dump_bytes(1)  # asked for through its pipe
    assert (folder / "nccl_trace_rank_2").read_bytes() == dump_bytes(2)[: 4 << 20]  # cut at the bound
    assert f"nccl_trace_rank_2 was cut to its first {4 << 20} of {len(dump_bytes(2))} bytes" in r.stderr
    assert f"NCCL flight recorder dumps of ranks 0-2: {folder} " in r.stderr
    assert f"python -m torch.distributed.flight_recorder.fr_trace {folder} -p nccl_trace_rank_" in r.stderr
    assert not (left := left_behind("DLTEST_MARK", tmp_path.name, 10)), f"ranks left behind: {left}"


def test_a_hang_that_a_restart_recovered_from_is_not_the_outcome(tmp_path):
    script = tmp_path / "hangs_once.py"
    script.write_text(
        "import os, time\n"
        "print('up', flush=True)\n"
        "if os.environ['RANK'] == '1' and os.environ['DISTLAUNCH_RESTART_COUNT'] == '0':\n"
        "    time.sleep(600)\n"
    )
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    args = ["run", "-n", "2", "--hang-timeout", "3", "--max-restarts", "1", "--grace-period", "1"]
    r = subprocess.run(distlaunch_cmd(*args, str(script)), capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "restarting the job (1/1) after the hang" in r.stderr
    outcome = next(line for line in r.stderr.splitlines() if line.startswith("job "))
    assert "finished" in outcome and "after 1 restart" in outcome, r.stderr  # before: "job ... hung" after success
    assert not re.search(r"job \S+ hung", r.stderr), r.stderr


# two stalls, each longer than the report's time and broken by a line of output, then the job's own exit code
STALLER = """\
import sys, time
def stall():
    time.sleep(4)
print("up", flush=True)
stall()
print("between the stalls", flush=True)
stall()
sys.exit(7)
"""


def test_without_hang_timeout_a_stall_is_reported_once_and_the_job_runs_on(tmp_path):
    """--hang-report: the grouped stacks once per stall (output is progress: it re-arms the report), saved beside
    a hang's, and the job ends as it ends by itself, never with 124."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(NO_COLOR="1", COLUMNS="200", DISTLAUNCH_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "staller.py").write_text(STALLER)
    argv = ["run", "-n", "2", "--hang-report", "1.5", "--grace-period", "1", "staller.py"]
    r = subprocess.run(distlaunch_cmd(*argv), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 7, r.stderr
    stalled = [ln for ln in r.stderr.splitlines() if ln.startswith("distlaunch: stalled: ")]
    assert (
        stalled
        == ["distlaunch: stalled: ranks 0-1 wait in stall (staller.py:3) (no progress for 1.5s; the job runs on)"] * 2
    ), r.stderr
    assert "[rank 1] between the stalls" in r.stdout  # it ran on after the first report
    (job,) = (tmp_path / "state" / "jobs").iterdir()
    for n in (1, 2):
        assert sorted(p.name for p in (job / f"stall-{n}").iterdir()) == ["rank0.txt", "rank1.txt"]
    assert f"distlaunch: full stacks: {job / 'stall-2'}" in r.stderr
    assert "hang:" not in r.stderr and "hung" not in r.stderr


def test_hang_report_zero_is_off_and_a_hang_timeout_below_it_stops_first(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(NO_COLOR="1", COLUMNS="200", DISTLAUNCH_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "staller.py").write_text(STALLER)
    (tmp_path / "quiet.py").write_text("import time\ntime.sleep(3)\n")
    off = ["run", "-n", "1", "--hang-report", "0", "quiet.py"]
    r = subprocess.run(distlaunch_cmd(*off), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "gathering" not in r.stderr, r.stderr
    both = ["run", "-n", "1", "--hang-timeout", "1.5", "--hang-report", "1.5", "--grace-period", "1", "staller.py"]
    r = subprocess.run(distlaunch_cmd(*both), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 124, r.stderr  # --hang-timeout as before: stacks, stop, 124; no report beside it
    assert "stalled:" not in r.stderr and r.stderr.count("gathering every rank's stack") == 1, r.stderr
