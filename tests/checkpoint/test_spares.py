"""Jobs with spares over real SSH (``--nnodes MIN:MAX``): the test sshd's node1..node3 (127.0.0.11-13), one slot
each, the engine's 2-rank reference job (dp=2, 20 steps, a checkpoint every 5). Mid-run, the rank on node2 is
killed with SIGKILL (as the kernel's OOM killer does): a failure that points at its host. With a spare, node3
takes node2's place on the same layout; without one, the job shrinks to dp=1 and keeps its global batch through
gradient accumulation. Either way it resumes from the step-5 or step-10 checkpoint and its loss curve is the
uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

from tests.checkpoint.conftest import (
    REPO,
    SAME_LAYOUT_RTOL,
    STEPS,
    cli_env,
    engine_args,
    max_relative,
    step_losses,
)
from tests.helpers import distlaunch_cmd, pids_with_env, run_cli, wait_until

ENV = {**os.environ, **cli_env()}  # the suite's own state folder: 'distlaunch status' finds the job's record
SHRINK_RTOL = 1e-5  # dp=2 -> dp=1 with the same global batch: the same sums in another order


def rank_pids(mark: str, rank: int) -> list[int]:
    """The processes of the job marked ``mark`` that run ``rank`` (by their environment, never by name)."""
    found = []
    for pid in pids_with_env("DLTEST_MARK", mark):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            found.append(pid)
    return found


def kill_rank_mid_run(tmp_path, hostfile, cluster, nodes: str) -> tuple[dict, str]:
    """Run the engine job with ``--nnodes nodes``; SIGKILL rank 1 once step 7 is in the metrics; the report."""
    mark = uuid.uuid4().hex
    metrics = tmp_path / "metrics.jsonl"
    args = [
        *["run", "--json", "--grace-period", "1", "--nnodes", nodes, "-H", str(hostfile)],
        *["--ssh-config", str(cluster.ssh_config), "--env", f"DLTEST_MARK={mark}", "--env", "OMP_NUM_THREADS"],
        *engine_args(tmp_path / "ckpt", metrics),
    ]
    proc = subprocess.Popen(
        distlaunch_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO
    )
    try:
        assert wait_until(lambda: metrics.exists() and max(step_losses(metrics), default=0) >= 7, 120, 0.2)
        victims = rank_pids(mark, 1)
        assert victims, "rank 1 not found"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out), err


def test_a_spare_takes_the_place_of_a_host_whose_rank_was_killed(reference, sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hostfile", nhosts=3, slots=1)
    report, err = kill_rank_mid_run(tmp_path, hostfile, sshd_cluster, "2:2")
    assert "quarantined node2 for the rest of the job: rank 1 was killed by SIGKILL" in err
    assert "node3 in place of node2" in err
    first, second = report["attempts"]
    assert (first["hosts"], second["hosts"]) == (["node1", "node2"], ["node1", "node3"])
    assert second["dropped"] == {"node2": "rank 1 was killed by SIGKILL"} and second["added"] == ["node3"]
    assert first["layout"] == second["layout"] == "dp=2,tp=1,pp=1,zero=0"
    losses = step_losses(tmp_path / "metrics.jsonl")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert max_relative(reference.losses, losses) <= SAME_LAYOUT_RTOL
    goodput = report["goodput"]
    (fault,) = goodput["faults"]
    assert fault["recomputed_steps"] is not None and 0 <= fault["recomputed_steps"] <= 5  # since the checkpoint
    assert 0 < goodput["productive_s"] < goodput["wall_s"] and 0 < goodput["ettr"] < 1
    status = run_cli("status", report["job_id"], env=ENV, cwd=REPO)
    assert "1: node1, node3 (dp=2,tp=1,pp=1,zero=0); -node2 (rank 1 was killed by SIGKILL); +node3" in " ".join(
        status.stdout.split()
    )  # the line may wrap at the terminal width
    assert f"(ETTR {goodput['ettr']:.0%})" in status.stdout, status.stdout


def test_without_a_spare_the_job_shrinks_and_keeps_its_global_batch(reference, sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hostfile", nhosts=2, slots=1)
    report, err = kill_rank_mid_run(tmp_path, hostfile, sshd_cluster, "1:2")
    assert "shrinking to 1 rank (dp=1,tp=1,pp=1,zero=0)" in err
    assert [a["world_size"] for a in report["attempts"]] == [2, 1] and report["world_size"] == 1
    assert report["attempts"][1]["hosts"] == ["node1"]
    losses = step_losses(tmp_path / "metrics.jsonl")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert max_relative(reference.losses, losses) <= SHRINK_RTOL
