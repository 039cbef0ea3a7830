"""Multi-host launch end to end: the real ``distlaunch`` CLI in a subprocess, a real sshd on 127.0.0.11-13
(3 hosts × 2 slots), real agents and ranks. A job's processes are found by DISTLAUNCH_JOB_ID in
/proc/*/environ (ranks, their children and the agents carry it), never by name."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import distlaunch
from tests.helpers import distlaunch_cmd, pids_with_env, run_cli, wait_until

WORKER = str(Path(__file__).parent / "scripts" / "worker.py")
TRICKY = [
    "a b",
    "it's",
    'say "hi"',
    "$(touch /tmp/distlaunch-pwned)",
    "x; exit 7",
    "two\nlines",
    "ünïcødé ✓ 🚀",
    "`id`",
    "*",
    "",
    "-",
]


def cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "NO_COLOR": "1", "COLUMNS": "160", **extra}


def launch_args(cluster, *args: str) -> list[str]:
    return ["run", "-H", str(cluster.hostfile), "--ssh-config", str(cluster.ssh_config), *args]


class Job:
    """A launcher running in the background; ``job_id`` is read from its ranks' "ready" lines."""

    def __init__(self, cluster, *args: str, cwd=None, **env):
        self.proc = subprocess.Popen(
            distlaunch_cmd(*launch_args(cluster, *args)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(**env),
            cwd=cwd,
        )
        self.lines: list[str] = []
        self.job_id = ""

    def wait_ready(self, count: int = 6, timeout: float = 60) -> Job:
        deadline = time.monotonic() + timeout
        while sum("ready rank=" in line for line in self.lines) < count:
            assert time.monotonic() < deadline, f"timed out waiting for {count} ready ranks: {self.lines}"
            line = self.proc.stdout.readline()
            assert line, f"launcher ended early: {self.lines} {self.proc.stderr.read()}"
            self.lines.append(line)
        self.job_id = re.search(r"job=(dl-\w+)", self.lines[0]).group(1)
        return self

    def processes(self) -> list[int]:
        return pids_with_env("DISTLAUNCH_JOB_ID", self.job_id)

    def finish(self, timeout: float = 60) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return "".join(self.lines) + out, err


def test_gloo_allreduce_across_three_hosts(sshd_cluster):
    r = run_cli(*launch_args(sshd_cluster, "-m", "distlaunch.examples.allreduce"), env=cli_env(), timeout=180)
    assert r.returncode == 0, r.stderr
    for rank in range(6):
        host = f"node{rank // 2 + 1}"
        assert f"[{host} rank {rank}] rank {rank}/6 (gloo): all_reduce(sum of rank+1) = 21 (ok)" in r.stdout, r.stdout
    assert "6 ranks exited 0" in r.stderr


def test_env_contract_forwarding_and_quoting_reach_remote_ranks(sshd_cluster, tmp_path):
    (tmp_path / ".distlaunch_env").write_text("# tuning\n\nFROM_FILE='file value'\nexport OVERRIDDEN=file\n")
    value = "v a l $(x) `y` ; 'q' \"d\"\nnext ü ✓"
    r = run_cli(
        *launch_args(sshd_cluster, "--env", f"TRICKY={value}", "--env", "OVERRIDDEN=cli", WORKER, "dump", *TRICKY),
        env=cli_env(NCCL_DEBUG="INFO", TORCH_SHOW_CPP_STACKTRACES="1", MY_SECRET_TOKEN="hush", UNRELATED="no"),
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    dumps = [json.loads(line.split("DUMP ", 1)[1]) for line in r.stdout.splitlines() if "DUMP " in line]
    assert sorted(int(d["env"]["RANK"]) for d in dumps) == list(range(6))
    for d in dumps:
        env = {k: bytes.fromhex(v).decode() for k, v in d["env_hex"].items()}
        assert [bytes.fromhex(a) for a in d["argv_hex"]] == [a.encode() for a in TRICKY]  # byte for byte
        assert env["TRICKY"].encode() == value.encode()
        assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["NNODES"]) == ("127.0.0.11", "6", "3")
        assert env["NODE_RANK"] == str(int(env["RANK"]) // 2) and env["LOCAL_RANK"] == str(int(env["RANK"]) % 2)
        assert (env["NCCL_DEBUG"], env["TORCH_SHOW_CPP_STACKTRACES"]) == ("INFO", "1")  # forwarded by prefix
        assert (env["FROM_FILE"], env["OVERRIDDEN"]) == ("file value", "cli")  # env file, then --env
        assert "UNRELATED" not in env and "MY_SECRET_TOKEN" not in env  # never the whole environment
        assert d["cwd"] == str(tmp_path)  # --workdir defaults to the launcher's directory
    assert not os.path.exists("/tmp/distlaunch-pwned")


def test_rank_failing_on_node3_stops_node1_and_node2(sshd_cluster):
    job = Job(sshd_cluster, "--grace-period", "1", WORKER, "hold", "5", "7").wait_ready()
    assert len(job.processes()) >= 3 + 6 + 6  # three agents, six ranks, each rank's child
    _out, err = job.finish()
    assert job.proc.returncode == 7, err
    assert "rank 5 on node3 exited with code 7" in err and "rank 5 failing now" in err
    assert wait_until(lambda: not job.processes(), 5), f"job processes left: {job.processes()}"


def test_ctrl_c_stops_every_rank_on_every_host(sshd_cluster):
    job = Job(sshd_cluster, "--grace-period", "1", WORKER, "hold").wait_ready()
    job.proc.send_signal(signal.SIGINT)
    _, err = job.finish()
    assert job.proc.returncode == 130, err
    assert wait_until(lambda: not job.processes(), 5), f"job processes left: {job.processes()}"


def test_agents_clean_up_within_5s_when_the_launcher_is_killed(sshd_cluster):
    job = Job(sshd_cluster, WORKER, "hold").wait_ready()  # default grace period 10 s: the agents cap it
    job.proc.kill()
    job.proc.wait()
    killed = time.monotonic()
    assert wait_until(lambda: not job.processes(), 5), f"job processes outlived the launcher: {job.processes()}"
    assert time.monotonic() - killed < 5


def test_two_concurrent_jobs_on_the_same_hosts_are_independent(sshd_cluster):
    first = Job(sshd_cluster, "--grace-period", "1", WORKER, "hold").wait_ready()
    second = Job(sshd_cluster, "--grace-period", "1", WORKER, "hold").wait_ready()
    assert first.job_id != second.job_id
    survivors = set(second.processes())
    first.proc.send_signal(signal.SIGINT)
    first.finish()
    assert first.proc.returncode == 130
    assert wait_until(lambda: not first.processes(), 5)
    assert set(second.processes()) == survivors  # untouched: every rank, child and agent still there
    second.proc.send_signal(signal.SIGINT)
    second.finish()
    assert second.proc.returncode == 130 and wait_until(lambda: not second.processes(), 5)


def test_unreachable_host_fails_fast_with_exit_3_and_starts_nothing(sshd_cluster, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host ghost\n  HostName 127.0.0.99\n  Port {sshd_cluster.port}\n\n" + sshd_cluster.ssh_config.read_text()
    )
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=2\nghost slots=2\nnode2 slots=2\nnowhere.invalid slots=1\n")
    mark = f"m{time.monotonic_ns()}"
    r = run_cli(
        "run",
        "-H",
        str(hostfile),
        "--ssh-config",
        str(config),
        "--env",
        f"DLTEST_MARK={mark}",
        WORKER,
        "hold",
        env=cli_env(),
        timeout=60,
    )
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "error: 2 hosts could not be reached; no rank was started:"
    assert (
        lines[1].startswith("  ghost: connection refused by 127.0.0.99") and "check that sshd runs on ghost" in lines[1]
    )
    assert lines[2].startswith("  nowhere.invalid: cannot resolve host name 'nowhere.invalid'")
    assert "ready" not in r.stdout and not pids_with_env("DLTEST_MARK", mark)


def test_unknown_host_key_exit_3_with_keyscan_line_unless_accepted(sshd_cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(sshd_cluster.ssh_config.read_text().replace(str(sshd_cluster.known_hosts), str(known)))
    args = ["run", "-H", str(sshd_cluster.hostfile), "--ssh-config", str(config), WORKER, "dump"]
    r = run_cli(*args, env=cli_env(), timeout=60)
    assert r.returncode == 3, r.stderr
    assert "3 hosts could not be reached" in r.stderr
    assert (
        f"hint: check the fingerprint, then run: ssh-keyscan -p {sshd_cluster.port} -H 127.0.0.13 >> {known}"
        in r.stderr
    )
    r = run_cli(*args[:-2], "--accept-new-host-keys", WORKER, "dump", env=cli_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(known.read_text().splitlines()) == 3  # recorded, so the next run needs no opt-in


def test_remote_python_that_cannot_run_the_agent_is_exit_3(sshd_cluster, tmp_path):
    r = run_cli(
        *launch_args(sshd_cluster, "--remote-python", "/nonexistent/python3", WORKER, "dump"), env=cli_env(), timeout=60
    )
    assert r.returncode == 3, r.stderr
    assert "node1: Python '/nonexistent/python3' not found" in r.stderr and "--remote-python" in r.stderr
    r = run_cli(
        *launch_args(sshd_cluster, "--workdir", str(tmp_path / "missing"), WORKER, "dump"), env=cli_env(), timeout=60
    )
    assert r.returncode == 3 and f"working directory {str(tmp_path / 'missing')!r} is not usable" in r.stderr, r.stderr


def test_max_restarts_restart_every_host(sshd_cluster):
    restart = str(Path(__file__).parents[1] / "launcher" / "scripts" / "restart.py")  # rank 1 fails on try 0 only
    r = run_cli(*launch_args(sshd_cluster, "--max-restarts", "1", restart), env=cli_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "[node3 rank 5] rank 5 try 1" in r.stdout and "after 1 restart" in r.stderr


def test_a_hostfile_that_starts_with_localhost_gives_remote_ranks_an_address_they_reach(sshd_cluster, tmp_path):
    hostfile = tmp_path / "mixed"
    hostfile.write_text("localhost slots=1\nnode2 slots=1\n")
    args = ["run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), WORKER, "dump"]
    r = run_cli(*args, env=cli_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    dumps = [json.loads(line.split("DUMP ", 1)[1]) for line in r.stdout.splitlines() if "DUMP " in line]
    # before: MASTER_ADDR=localhost, which node2 resolves to itself
    assert {d["env"]["MASTER_ADDR"] for d in dumps} == {"127.0.0.1"}  # this machine on the route to 127.0.0.12


def test_paths_and_interpreters_reach_remote_hosts_as_they_are_meant(sshd_cluster, tmp_path):
    """--workdir relative to the launcher's folder (not the remote login folder); --python picks the ranks'
    interpreter only (the agent runs on --remote-python, by default this one); a missing script is exit 2 there,
    as python says it."""
    import shutil
    import sys

    (tmp_path / "sub").mkdir()
    shutil.copy(WORKER, tmp_path / "sub" / "worker.py")
    bare = tmp_path / "bare"  # a Python without distlaunch: enough for ranks, which start through rankboot
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    args = launch_args(sshd_cluster, "--workdir", "sub", "--python", str(bare / "bin" / "python"), "worker.py", "dump")
    r = run_cli(*args, env=cli_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr  # before: 'working directory sub is not usable', then 'cannot import distlaunch'
    dumps = [json.loads(line.split("DUMP ", 1)[1]) for line in r.stdout.splitlines() if "DUMP " in line]
    assert len(dumps) == 6 and {d["cwd"] for d in dumps} == {str(tmp_path / "sub")}
    missing = run_cli(*launch_args(sshd_cluster, "nosuch.py"), env=cli_env(), cwd=tmp_path, timeout=120)
    assert missing.returncode == 2, missing.stderr  # before: 1, with runpy's FileNotFoundError traceback
    line = f"error: script 'nosuch.py' does not exist on node1, node2, node3 (ranks start in {tmp_path})"
    assert line in missing.stderr, missing.stderr  # one line for every host, found before any rank started
    assert "Traceback" not in missing.stdout + missing.stderr and "[rank" not in missing.stdout


def test_a_program_one_host_cannot_start_starts_no_rank_anywhere(sshd_cluster, tmp_path):
    """Every agent checks its own host before any rank starts anywhere: a program found here (the local
    ranks inherit this PATH) but not on node2 (its ranks get the login PATH) starts nothing, here included."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ran"
    program = bin_dir / "mytool"
    program.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    program.chmod(0o755)
    hostfile = tmp_path / "mixed"
    hostfile.write_text("localhost slots=1\nnode2 slots=2\n")
    env = cli_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    args = ["run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config)]
    r = run_cli(*args, "--no-python", "mytool", env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr  # before: 127, after the rank here had run
    assert "error: program 'mytool' is not on the ranks' PATH on node2" in r.stderr, r.stderr
    assert "search their own login PATH, not this machine's" in r.stderr
    assert not marker.exists()  # the local rank never started
    local = run_cli(*args, "--no-python", "othertool", env=env, cwd=tmp_path, timeout=120)
    assert local.returncode == 2 and "program 'othertool' is not on the ranks' PATH here" in local.stderr  # this host
    path = f"PATH={bin_dir}:/usr/bin:/bin"  # the ranks' PATH on every host
    ok = run_cli(*args, "--env", path, "--no-python", "mytool", env=env, cwd=tmp_path, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert marker.read_text().count("ran") == 3


def test_a_module_missing_on_the_remote_hosts_is_found_by_their_python_before_any_rank_starts(sshd_cluster, tmp_path):
    (tmp_path / "here_only.py").write_text("print('ran')\n")
    args = launch_args(sshd_cluster, "--workdir", str(tmp_path / "empty"), "-m", "here_only")
    (tmp_path / "empty").mkdir()
    r = run_cli(*args, env=cli_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: no module named 'here_only' for -m here_only on node1, node2, node3" in r.stderr, r.stderr
    assert "] ran" not in r.stdout
    ok = run_cli(*launch_args(sshd_cluster, "-m", "here_only"), env=cli_env(), cwd=tmp_path, timeout=120)
    assert ok.returncode == 0 and ok.stdout.count("] ran\n") == 6, ok.stdout + ok.stderr


def test_an_interpreter_that_never_answers_the_module_check_does_not_hold_the_job(sshd_cluster, tmp_path):
    """The agents ask the ranks' Python whether it finds the module; one that hangs (here: a sitecustomize
    that sleeps, only for that question) is not judged, within the heartbeat timeout, and the ranks start."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys, time\nif '--find-module' in sys.argv:\n    time.sleep(120)\n")
    (tmp_path / "mod.py").write_text("print('ran')\n")
    args = launch_args(sshd_cluster, "--heartbeat-timeout", "6", "--env", f"PYTHONPATH={site}", "-m", "mod")
    r = run_cli(*args, env=cli_env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr  # not 'node1 has been silent for 6.0s'
    assert r.stdout.count("] ran\n") == 6, r.stdout


def test_a_host_with_an_older_distlaunch_is_refused_before_any_rank_starts(sshd_cluster, tmp_path):
    """node2..3 run the agent of another distlaunch (a copy whose hello predates the protocol version,
    as every agent before the gate): it would start its ranks unchecked, so the launch stops first."""
    old = tmp_path / "old"
    shutil.copytree(Path(distlaunch.__file__).parent, old / "distlaunch", ignore=shutil.ignore_patterns("__pycache__"))
    agent = old / "distlaunch" / "agent" / "core.py"  # where the hello is written
    source = agent.read_text()
    assert ", protocol=p.PROTOCOL" in source
    agent.write_text(source.replace(", protocol=p.PROTOCOL", ""))
    python = tmp_path / "python-old"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={old} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    marker = tmp_path / "ran"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    args = launch_args(sshd_cluster, "--remote-python", str(python), str(script))
    r = run_cli(*args, env=cli_env(), cwd=tmp_path, timeout=120)  # not a checkout: -m finds the copy
    assert r.returncode == 3, r.stdout + r.stderr
    for host in ("node1", "node2", "node3"):
        assert f"{host}: its distlaunch is older than this launcher's (agent protocol 1, here" in r.stderr, r.stderr
    assert "install distlaunch " in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()  # no rank ran anywhere
