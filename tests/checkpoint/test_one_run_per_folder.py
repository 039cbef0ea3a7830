"""One training run per ``checkpoint.dir`` (the real CLI, real ranks): a second job while the first one
trains into the folder is refused, by the launcher before any rank starts and by the rank 0 of a job
started without it; ``--resume never`` refuses a folder that holds another run's checkpoints, while its
own restarts continue it; a ``step_N`` folder given as ``checkpoint.dir`` is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from distlaunch.files import lock_holder
from distlaunch.training.checkpoint.folder import list_checkpoints
from distlaunch.training.places import CHECKPOINT_LOCK
from tests.checkpoint.conftest import REPO, cli_env
from tests.helpers import distlaunch_cmd, run_cli, wait_until

SMALL = ["model.preset='tiny'", "train.global_batch_size=4", "train.seq_len=32", "checkpoint.every=2"]


def sets(*overrides: str) -> list[str]:
    return [arg for o in [*SMALL, *overrides] for arg in ("--set", o)]


def train(ckpt, *args: str, steps: int = 4):
    return run_cli(
        "train", "-n", "1", *args, *sets(f"train.steps={steps}", f"checkpoint.dir='{ckpt}'"), env=cli_env(), cwd=REPO
    )


def test_a_second_job_in_a_folder_another_job_trains_into_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = subprocess.Popen(
        distlaunch_cmd("train", "-n", "1", *sets("train.steps=100000", f"checkpoint.dir='{ckpt}'")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **cli_env()},
        cwd=REPO,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: lock_holder(ckpt / CHECKPOINT_LOCK) is not None, timeout=120), "never locked"
        holder = lock_holder(ckpt / CHECKPOINT_LOCK)
        assert holder.startswith("job dl-") and "(rank 0, pid " in holder, holder
        second = train(ckpt)  # the launcher's look
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert second.stderr.strip() == (
            f"error: checkpoint.dir {ckpt} is in use by {holder} (hint: give this job a checkpoint.dir of its own, "
            "or wait until that job ends (two jobs in one folder would delete, prune and resume each other's "
            "checkpoints))"
        )
        assert "[rank 0]" not in second.stdout  # no rank started
        engine = subprocess.run(  # no launcher to look first: the rank 0 of a plain process refuses it itself
            [sys.executable, "-m", "distlaunch.engine", *sets("train.steps=2", f"checkpoint.dir='{ckpt}'")],
            capture_output=True,
            text=True,
            env={**os.environ, **cli_env()},
            cwd=REPO,
            timeout=120,
        )
        assert engine.returncode == 2, engine.stdout[-2000:] + engine.stderr[-2000:]
        assert f"error: checkpoint.dir {ckpt} is in use by {holder}" in engine.stderr, engine.stderr
        assert first.poll() is None  # the first job trains on, its saves untouched
    finally:
        os.killpg(first.pid, signal.SIGTERM)  # our own launcher's session: it stops its ranks
        first.wait(60)
    assert lock_holder(ckpt / CHECKPOINT_LOCK) is None  # free once the job has ended


def test_never_refuses_another_runs_checkpoints_and_its_restarts_continue_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert train(ckpt).returncode == 0
    before = sorted(p.name for p in ckpt.iterdir())
    again = train(ckpt, "--resume", "never")
    assert again.returncode == 2, again.stdout[-2000:] + again.stderr[-2000:]
    assert (
        f"checkpoint.dir {ckpt} already holds 2 checkpoints of another run (step_000002 … step_000004)" in again.stderr
    )
    assert "give this run a new checkpoint.dir" in again.stderr and "[rank 0]" not in again.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == before
    fresh = tmp_path / "fresh"  # rank 0 crashes at step 3: the restart resumes this run's step 2
    crash = ["--max-restarts", "1", "--grace-period", "1"]
    faults = [arg for o in ("fault.rank=0", "fault.step=3", "fault.kind='crash'") for arg in ("--set", o)]
    r = train(fresh, "--resume", "never", *crash, *faults)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resumed from {fresh / 'step_000002'} (step 2" in r.stdout, r.stdout[-3000:]
    assert [p.name for p in list_checkpoints(fresh)] == ["step_000002", "step_000004"]


def test_a_step_folder_given_as_checkpoint_dir_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert train(ckpt).returncode == 0
    step = ckpt / "step_000004"
    for dry_run in ((), ("--dry-run",)):
        r = train(step, *dry_run)
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
        assert r.stderr.strip() == (
            f"error: checkpoint.dir {step} is one checkpoint (step_000004), not the folder of a run's checkpoints "
            f"(hint: point checkpoint.dir at {ckpt}, or resume from this one with --resume {step})"
        )
    assert sorted(p.name for p in step.iterdir()) == sorted(p.name for p in (ckpt / "step_000002").iterdir())
