"""Batch jobs submitted by ``distlaunch slurm sbatch`` in the job registry, on the real two-node test cluster:
listed with Slurm's state, their output file shown by ``logs``, stopped by ``stop`` (scancel); and what
``jobs``, ``status``, ``stop`` and ``sbatch --wait`` do when slurmctld cannot be reached (a copy of the
cluster's slurm.conf whose SlurmctldPort nothing listens on, or a SLURM_CONF that names no file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distlaunch.contract.endpoint import free_port
from distlaunch.slurm import jobstate
from tests.helpers import distlaunch_cmd, wait_until

TICKER = textwrap.dedent(
    """
    import os, sys, time
    for i in range(int(sys.argv[1])):
        print(f"tick {i} of rank {os.environ['RANK']}", flush=True)
        time.sleep(0.2)
    """
)


def test_sbatch_job_is_listed_logged_and_stopped(slurm_cluster, tmp_path):
    env = {**slurm_cluster.env, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state")}
    (tmp_path / "ticker.py").write_text(TICKER)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(distlaunch_cmd(*args), capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    submitted = cli("slurm", "sbatch", "-N", "2", "--ntasks-per-node", "1", "-o", "out-%j.log", "ticker.py", "100000")
    assert submitted.returncode == 0, submitted.stderr
    slurm_id = submitted.stdout.split()[-1]

    def status() -> dict:
        return json.loads(cli("status", slurm_id, "--json").stdout)  # Slurm's own id finds the record

    assert wait_until(lambda: status()["state"] == "running", 60, interval=0.5)
    [listed] = json.loads(cli("jobs", "--json").stdout)
    assert (listed["job_id"], listed["backend"], listed["world_size"]) == (f"slurm-{slurm_id}", "slurm", 2)
    assert listed["output"] == str(tmp_path / f"out-{slurm_id}.log")

    assert wait_until(lambda: "tick 2 of rank 1" in cli("logs", f"slurm-{slurm_id}").stdout, 60, interval=0.5)
    rank1 = cli("logs", slurm_id, "--rank", "1", "--tail", "2").stdout.splitlines()
    assert len(rank1) == 2 and all(line.startswith("1: tick") for line in rank1)  # srun --label lines

    stopped = cli("stop", slurm_id, "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["state"] == "stopped"
    assert slurm_cluster.client("squeue", "-h", "-j", slurm_id).stdout.strip() == ""
    assert "stopped" in cli("jobs").stdout


def unreachable_conf(cluster, path: Path) -> Path:
    """A copy of the cluster's slurm.conf whose slurmctld port has nothing listening on it."""
    text = cluster.conf.read_text()
    path.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={free_port()}", text))
    return path


class Cli:
    """The real CLI in a subprocess, against the test cluster (or another SLURM_CONF), with a private state dir."""

    def __init__(self, cluster, tmp_path: Path):
        self.cluster, self.cwd = cluster, tmp_path
        self.env = {**cluster.env, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state")}
        (tmp_path / "ticker.py").write_text(TICKER)

    def __call__(self, *args: str, conf: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**self.env, **({"SLURM_CONF": str(conf)} if conf else {})}
        return subprocess.run(
            distlaunch_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env, cwd=self.cwd
        )

    def submit(self, *args: str) -> str:
        r = self("slurm", "sbatch", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()[-1]

    def state(self, slurm_id: str) -> str:
        return json.loads(self("status", slurm_id, "--json").stdout)["state"]


def timed(cli: Cli, *args: str, conf: Path) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    r = cli(*args, conf=conf)
    return r, time.monotonic() - start


def test_an_unreachable_slurmctld_leaves_a_running_job_running_not_lost(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    slurm_id = cli.submit("-N", "2", "--ntasks-per-node", "1", "-o", "out-%j.log", "ticker.py", "100000")
    assert wait_until(lambda: cli.state(slurm_id) == "running", 60, interval=0.5)
    down = unreachable_conf(slurm_cluster, tmp_path / "down.conf")

    # jobs: the last known state, marked, with why; quickly (slurmctld's own retries take ~18 s per job)
    listed, took = timed(cli, "jobs", conf=down)
    assert listed.returncode == 0, listed.stderr
    assert took < 10, f"'distlaunch jobs' took {took:.1f}s with slurmctld unreachable"
    assert re.search(rf"slurm-{slurm_id} .* running\? ", listed.stdout), listed.stdout
    assert f"slurm-{slurm_id}: state unknown (last known: running): cannot reach slurmctld: " in listed.stdout
    [record] = json.loads(cli("jobs", "--json", conf=down).stdout)
    assert record["state"] == "running" and record["unknown"].startswith("cannot reach slurmctld: ")

    # status: one line, exit 3, never "lost"
    shown = cli("status", slurm_id, conf=down)
    assert shown.returncode == 3 and shown.stderr.count("\n") == 1, shown.stderr
    assert "error: cannot reach slurmctld: Slurmctld" in shown.stderr and "last known state is running" in shown.stderr

    # stop: tries scancel and says why it failed (exit 3, as with kubectl); the job still runs
    stop = cli("stop", slurm_id, conf=down)
    assert stop.returncode == 3 and stop.stderr.count("\n") == 1, stop.stderr
    assert f"scancel {slurm_id} failed: " in stop.stderr and "Unable to contact slurm controller" in stop.stderr
    assert slurm_cluster.client("squeue", "-h", "-o", "%T", "-j", slurm_id).stdout.strip() == "RUNNING"

    # logs: the output file is here whatever slurmctld does
    logs = cli("logs", slurm_id, "--tail", "1", conf=down)
    assert logs.returncode == 0 and "tick" in logs.stdout, logs.stderr

    # SLURM_CONF naming no file: said at once (Slurm's commands would wait 60 s for it, each)
    missing = tmp_path / "no-such.conf"
    listed, took = timed(cli, "jobs", conf=missing)
    assert took < 10 and "running?" in listed.stdout and f"SLURM_CONF={missing} does not exist" in listed.stdout
    shown = cli("status", slurm_id, conf=missing)
    assert shown.returncode == 3 and f"cannot reach slurmctld: SLURM_CONF={missing} does not exist" in shown.stderr

    # no Slurm client here at all (another login node): unknown too, never the old state as if current.
    # The interpreter is run by its own path with a PATH that holds nothing: a link to it elsewhere would
    # lose a virtual environment's site-packages (its pyvenv.cfg is found beside the path it was started by).
    bare = tmp_path / "bin"
    bare.mkdir()
    no_client = subprocess.run(
        [sys.executable, "-m", "distlaunch", "jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**cli.env, "PATH": str(bare)},
        cwd=cli.cwd,
    )
    assert no_client.returncode == 0, no_client.stderr
    assert re.search(rf"slurm-{slurm_id} .* running\? ", no_client.stdout), no_client.stdout
    assert "state unknown (last known: running): Slurm's client commands (scontrol, sacct)" in no_client.stdout

    # slurmctld back: the job is running all along, and stops
    assert cli.state(slurm_id) == "running"
    stopped = cli("stop", slurm_id, "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["state"] == "stopped", stopped.stderr


def test_status_of_a_two_node_job_shows_its_nodes_and_ranks(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    waiting = cli.submit("-N", "3", "-o", "out-%j.log", "ticker.py", "1")  # the cluster has 2 nodes: pending
    shown = cli("status", waiting)
    assert "ranks      3 on 3 nodes" in shown.stdout and "HOST" not in shown.stdout, shown.stdout
    assert cli("stop", waiting).returncode == 0

    slurm_id = cli.submit("-N", "2", "--ntasks-per-node", "2", "-o", "out-%j.log", "ticker.py", "100000")
    assert wait_until(lambda: cli.state(slurm_id) == "running", 60, interval=0.5)
    shown = cli("status", slurm_id)
    assert "ranks      4 on 2 nodes" in shown.stdout, shown.stdout
    lines = shown.stdout.splitlines()
    table = [line.split() for line in lines[next(i for i, line in enumerate(lines) if line.startswith("HOST")) :]]
    assert table == [
        ["HOST", "NODE", "RANKS", "STATE"],
        ["node1", "0", "0-1", "running"],
        ["node2", "1", "2-3", "running"],
    ]
    assert "node1,node2" in cli("jobs").stdout
    assert cli("stop", slurm_id).returncode == 0
    shown = cli("status", slurm_id)  # the final record keeps its nodes
    assert ["node2", "1", "2-3", "stopped"] in [line.split() for line in shown.stdout.splitlines()], shown.stdout


def test_status_of_a_failed_batch_job_says_failed_and_names_the_ranks_backend(slurm_cluster, tmp_path):
    """Slurm tells only that the job failed, not which rank: every node reads failed (not "stopped", which
    says another rank's failure stopped it); the backend is the ranks' (gloo, nccl), never the scheduler."""
    cli = Cli(slurm_cluster, tmp_path)
    (tmp_path / "fail.py").write_text("import os, sys\nsys.exit(7 if os.environ['RANK'] == '2' else 0)\n")
    slurm_id = cli.submit("-N", "2", "--ntasks-per-node", "2", "--backend", "gloo", "-o", "out-%j.log", "fail.py")
    assert wait_until(lambda: cli.state(slurm_id) == "failed", 90, interval=0.5)
    shown = cli("status", slurm_id).stdout
    assert "4-way data parallel (backend gloo)" in shown, shown  # before: (backend slurm)
    rows = [line.split() for line in shown.splitlines()]
    assert ["node1", "0", "0-1", "failed"] in rows and ["node2", "1", "2-3", "failed"] in rows, shown
    auto = cli.submit("-N", "1", "-o", "out-%j.log", "ticker.py", "1")
    assert wait_until(lambda: cli.state(auto) == "succeeded", 90, interval=0.5)
    assert "(backend chosen on the nodes: nccl with GPUs, else gloo)" in cli("status", auto).stdout


def test_sbatch_wait_follows_a_job_through_a_slurmctld_outage(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    conf = tmp_path / "slurm.conf"  # the client's config: good, then unreachable for a while, then good again
    good = slurm_cluster.conf.read_text()
    conf.write_text(good)
    waiting = subprocess.Popen(
        distlaunch_cmd("slurm", "sbatch", "-N", "1", "-o", "out-%j.log", "--wait", "ticker.py", "60"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**cli.env, "SLURM_CONF": str(conf)},
    )  # fmt: skip
    try:
        assert wait_until(lambda: any("tick 1 " in p.read_text() for p in tmp_path.glob("out-*.log")), 60, 0.2)
        unreachable_conf(slurm_cluster, conf)
        time.sleep(4)  # a few polls of --wait fail meanwhile
        conf.write_text(good)
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err
    assert "cannot reach slurmctld: " in err and "may still run: asking again for up to 600s" in err, err
    assert "slurmctld answers again" in err and "is COMPLETED" in err, err
    assert "tick 59 of rank 0" in out


def test_sbatch_wait_gives_up_on_slurmctld_after_a_bound_and_says_why(slurm_cluster, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SLURM_CONF", str(unreachable_conf(slurm_cluster, tmp_path / "down.conf")))
    monkeypatch.setenv("PATH", slurm_cluster.env["PATH"])
    monkeypatch.setattr(jobstate, "UNANSWERED_WAIT_S", 2.0)
    with pytest.raises(jobstate.SlurmUnanswered) as raised:
        jobstate.wait_for_job("1")
    assert raised.value.exit_code == 3
    assert str(raised.value).startswith("gave up following job 1: cannot reach slurmctld: Slurmctld")
    told = [r.getMessage() for r in caplog.records if r.name == "distlaunch"]  # the CLI prints them (-q: not)
    assert sum("asking again for up to 2s" in line for line in told) == 1, told


def test_sbatch_values_with_spaces_and_quotes_reach_slurm_as_given(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    name = 'my "run" #1 \\ it\'s'
    r = cli("slurm", "sbatch", "-J", name, "-o", "my logs/%x-%j.out", "--wait", "ticker.py", "1")
    assert r.returncode == 0, r.stderr
    slurm_id = re.search(r"submitted batch job (\d+)", r.stdout).group(1)
    shown = slurm_cluster.client("scontrol", "show", "job", "-o", slurm_id).stdout
    assert f"JobName={name} UserId=" in shown, shown
    assert "tick 0 of rank 0" in (tmp_path / "my logs" / f"{name}-{slurm_id}.out").read_text()


def test_a_newline_in_an_sbatch_value_is_refused_before_submitting(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    before = slurm_cluster.client("squeue", "-h", "-o", "%i").stdout
    r = cli("slurm", "sbatch", "-p", "debug\nsrun touch injected", "ticker.py", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "-p/--partition 'debug\\nsrun touch injected' holds a control character" in r.stderr
    assert slurm_cluster.client("squeue", "-h", "-o", "%i").stdout == before
    assert not (tmp_path / "injected").exists()


def test_stopping_a_pending_job_says_stopped_with_143_as_any_stop(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster, tmp_path)
    slurm_id = cli.submit("-N", "3", "ticker.py", "10")  # 3 nodes on a 2-node cluster: pending for good
    assert wait_until(lambda: cli.state(slurm_id) == "pending", 60, interval=0.5)
    stopped = cli("stop", slurm_id, "--json")
    assert stopped.returncode == 0, stopped.stderr
    record = json.loads(stopped.stdout)
    assert record["state"] == "stopped" and record["exit_code"] == 143, record  # was exit 1: Slurm's 0:0
