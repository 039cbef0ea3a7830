"""A multi-host restart over real SSH: 2 hosts x 1 slot on the test sshd (127.0.0.11-12); the rank on
node2 crashes at step 12, ``--max-restarts 1`` stops both hosts, starts both again, and the engine
resumes from the step-10 checkpoint (on the shared filesystem) into the uninterrupted run."""

from __future__ import annotations

from tests.checkpoint.conftest import SAME_LAYOUT_RTOL, STEPS, launch_engine, max_relative


def test_crash_on_the_second_host_restarts_both_hosts_and_resumes(reference, sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hostfile", nhosts=2, slots=1)
    run = launch_engine(
        tmp_path,
        "-H",
        str(hostfile),
        "--ssh-config",
        str(sshd_cluster.ssh_config),
        "--max-restarts",
        "1",
        overrides=("fault.rank=1", "fault.step=12"),
    )
    assert "[node2 rank 1] fault injection: rank 1 crashes at step 12" in run.output
    assert "restarting the job (1/1) after rank 1 on node2 exited with code 42" in run.output
    assert f"[node1 rank 0] resumed from {run.ckpt / 'step_000010'} (step 10" in run.output
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    assert max_relative(reference.losses, run.losses) <= SAME_LAYOUT_RTOL
