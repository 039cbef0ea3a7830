"""The warm start (``--preload``, distlaunch/agent/warm.py): a host imports the ranks' modules once and forks its
ranks from that process; each rank is still what a cold start makes it (its own session, CPUs, environment,
argv, output, exit status), stopped and ended like one, and a preload that fails starts the ranks cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from distlaunch.agent.warm import Preloaded, shared_env
from distlaunch.contract.options import LaunchOptions
from distlaunch.launcher.planning.program import preload_modules
from distlaunch.training.argv import ENGINE_PRELOAD
from tests.helpers import (
    children,
    distlaunch_cmd,
    invoke,
    left_behind,
    pids_with_env,
    run_cli,
    running,
    wait_until,
)

SCRIPTS = Path(__file__).parent / "scripts"
RANK = str(SCRIPTS / "warm_rank.py")


def job_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "NO_COLOR": "1", "COLUMNS": "120", "WARM_MARKS": str(tmp_path / "marks"), **extra}


def reports(stdout: str) -> list[dict]:
    found = [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line]
    return sorted(found, key=lambda r: r["rank"])


def test_a_host_imports_once_and_each_forked_rank_starts_as_a_cold_one_would(tmp_path):
    """Two ranks, one import: each rank finds the module already imported, yet has its own session, the CPUs
    --cpu-bind gave it, its argv, sys.path, working directory and empty stdin, its output on its own
    streams; torch, preloaded under the ranks' OMP_NUM_THREADS=1, runs one thread in each."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    first, second = sorted(os.sched_getaffinity(0))[:2]
    bind = f"{second}:{first}"
    args = ["run", "-n", "2", "--preload", "warm_marker,torch", "--cpu-bind", bind, "--workdir", str(workdir), RANK]
    args += ["a", "b c"]
    r = run_cli(*args, env=job_env(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    marks = (tmp_path / "marks").read_text().split()
    ranks = reports(r.stdout)
    assert len(marks) == 1 and [x["rank"] for x in ranks] == [0, 1], (marks, r.stdout)
    assert all(x["preloaded"] and x["own_session"] and x["stdin_empty"] for x in ranks), ranks
    assert str(marks[0]) not in {str(x["pid"]) for x in ranks}  # the import ran in the preloaded process only
    assert [x["cpus"] for x in ranks] == [[second], [first]], ranks
    assert all(x["argv"] == [RANK, "a", "b c"] and x["path0"] == str(SCRIPTS) for x in ranks), ranks
    assert all(x["cwd"] == str(workdir) and x["threads"] == 1 for x in ranks), ranks
    # what ps, pgrep and a search of /proc/*/environ see: the rank's own command line and environment
    assert all(x["cmdline"][-3:] == [RANK, "a", "b c"] and x["cmdline"][-4].endswith("rankboot.py") for x in ranks)
    assert [x["environ_rank"] for x in ranks] == [["RANK=0"], ["RANK=1"]], ranks
    for rank in range(2):
        assert f"[rank {rank}] rank {rank} to stderr" in r.stderr
    assert not pids_with_env("WARM_MARKS", str(tmp_path / "marks"))  # the preloaded process is gone too


def test_a_forked_rank_that_fails_stops_the_others_and_sets_the_exit_code(tmp_path):
    r = run_cli("run", "-n", "2", "--preload", "warm_marker", RANK, env=job_env(tmp_path, EXIT_RANK="1", EXIT_CODE="7"))
    assert r.returncode == 7, r.stderr
    assert "rank 1 on localhost exited with code 7" in r.stderr
    assert all(x["preloaded"] for x in reports(r.stdout))


def test_a_preload_that_fails_says_so_in_one_line_and_the_ranks_start_cold(tmp_path):
    r = run_cli("run", "-n", "2", "--preload", "no_such_module_here", RANK, env=job_env(tmp_path))
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "preloading" in x]
    assert "preloading no_such_module_here failed on this host (ModuleNotFoundError" in line
    assert line.endswith("its ranks start cold")
    assert [x["preloaded"] for x in reports(r.stdout)] == [False, False]


@pytest.mark.parametrize("how", ["launcher killed", "SIGTERM", "agent killed"])
def test_forked_ranks_and_their_children_never_outlive_the_job(tmp_path, how):
    """Stubborn ranks (SIGTERM ignored, a child each) forked from the preloaded process: a SIGTERM to the launcher
    stops them all, and so does the launcher's SIGKILL (the agent stops them); the agent's own SIGKILL takes the
    ranks with it (their parent's death is theirs, as a cold-started rank's is)."""
    mark = uuid.uuid4().hex
    argv = distlaunch_cmd("run", "-n", "2", "--grace-period", "1", "--preload", "warm_marker", "--env")
    proc = subprocess.Popen(
        [*argv, f"DLTEST_MARK={mark}", str(SCRIPTS / "stubborn.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=job_env(tmp_path),
    )
    try:
        assert wait_until(lambda: len(pids_with_env("DLTEST_MARK", mark)) >= 4, 60)  # two ranks, a child each
        (agent,) = children(proc.pid)
        ranks = children(agent)
        assert len(ranks) == 2, ranks  # the ranks are the agent's own children, the preloaded process is gone
        if how == "agent killed":
            os.kill(agent, signal.SIGKILL)
            assert wait_until(lambda: not any(running(pid) for pid in ranks), 5), "a rank outlived its agent"
            proc.communicate(timeout=30)  # the launcher gives the host up
            assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"a rank's child outlived the job: {left}"
            return
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            assert proc.returncode == 143
        else:
            proc.kill()
            proc.wait()
        assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"a forked rank or its child survived: {left}"
    finally:
        proc.kill()
        proc.communicate()


def test_a_stop_while_the_host_still_imports_ends_the_job_at_once(tmp_path):
    """SIGTERM while the preloaded process is a minute into its imports: no rank ever started, the job ends in
    seconds with 143, and the preloaded process (it carries the job's mark) is gone."""
    mark = uuid.uuid4().hex
    argv = distlaunch_cmd("run", "-n", "2", "--preload", "slow_import", "--env", f"DLTEST_MARK={mark}", RANK)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(tmp_path))
    try:
        assert wait_until(lambda: len(pids_with_env("DLTEST_MARK", mark)) >= 1, 30)  # the preloaded process
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143 and time.monotonic() - began < 10, err
        assert not (left := left_behind("DLTEST_MARK", mark, 5)), f"the preloaded process survived: {left}"
    finally:
        proc.kill()
        proc.communicate()


def test_a_rank_whose_import_time_variables_differ_starts_cold():
    """OpenMP reads OMP_NUM_THREADS when torch loads it: a rank whose value is not the preloaded process's cannot be
    forked from it; per-rank variables (RANK) do not matter."""
    envs = [
        {"RANK": "0", "OMP_NUM_THREADS": "2", "PATH": "/bin"},
        {"RANK": "1", "OMP_NUM_THREADS": "2", "PATH": "/bin"},
    ]
    assert shared_env(envs) == {"OMP_NUM_THREADS": "2", "PATH": "/bin"}
    warm = Preloaded.__new__(Preloaded)
    warm.env = shared_env(envs)
    assert warm.fits({"RANK": "7", "OMP_NUM_THREADS": "2", "PATH": "/bin"})
    assert not warm.fits({"RANK": "0", "OMP_NUM_THREADS": "1", "PATH": "/bin"})
    assert not warm.fits({"RANK": "0", "OMP_NUM_THREADS": "2", "PATH": "/bin", "LD_PRELOAD": "x.so"})


def test_auto_preloads_the_engine_only():
    engine = LaunchOptions(program=["distlaunch.engine", "--set", "train.steps=1"], module=True)
    assert preload_modules(engine) == list(ENGINE_PRELOAD)
    assert preload_modules(engine.model_copy(update={"preload": "none"})) == []
    assert preload_modules(LaunchOptions(program=["train.py"])) == []  # its imports may depend on what it does first
    assert preload_modules(LaunchOptions(program=["train.py"], preload="torch,numpy")) == ["torch", "numpy"]


def test_the_plan_says_what_each_host_preloads_and_a_bad_name_is_one_line():
    shown = invoke(["train", "-n", "2", "--dry-run"])
    assert shown.exit_code == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert f"preload (each host imports these once, then forks its ranks): {', '.join(ENGINE_PRELOAD)}" in said
    assert "preload" not in invoke(["run", "-n", "2", "--dry-run", RANK]).stdout
    bad = invoke(["run", "-n", "2", "--preload", "torch,not a module", RANK])
    assert bad.exit_code == 2
    assert "--preload 'torch,not a module': 'not a module' is not a module name" in bad.stderr
