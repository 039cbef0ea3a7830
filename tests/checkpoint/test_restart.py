"""Restarts that lose no work: a crash, a hang and a crash inside a save, each recovered by
``--max-restarts 1`` into exactly the uninterrupted run (real ranks, real gloo, the real CLI).

Every job: 2 ranks (dp=2), 20 steps, a checkpoint every 5 steps, keep 2. The faults fire on the
first try only (``fault.every_try`` is off), so the restart succeeds.
"""

from __future__ import annotations

import torch

from distlaunch.engine.checkpoint.export import consolidated_state
from distlaunch.training.checkpoint.folder import LEFTOVER, latest_checkpoint
from tests.checkpoint.conftest import SAME_LAYOUT_RTOL, STEPS, launch_engine, max_relative


def assert_same_run(run, reference) -> None:
    """Every step's loss, and the final weights and optimizer state, equal the reference's."""
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    assert max_relative(reference.losses, run.losses) <= SAME_LAYOUT_RTOL
    final, expected = latest_checkpoint(run.ckpt), latest_checkpoint(reference.ckpt)
    assert final.name == expected.name == f"step_{STEPS:06d}"
    for prefix in ("model.", "optim."):
        got, want = consolidated_state(final, prefix), consolidated_state(expected, prefix)
        assert got.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=SAME_LAYOUT_RTOL, atol=0, msg=name)


def test_rank_crash_at_step_12_restarts_from_step_10_and_matches_the_uninterrupted_run(reference, tmp_path):
    run = launch_engine(
        tmp_path, "-n", "2", "--max-restarts", "1", overrides=("fault.rank=1", "fault.step=12", "fault.kind='crash'")
    )
    assert "rank 1 crashes at step 12" in run.output
    assert "restarting the job (1/1) after rank 1 on localhost exited with code 42" in run.output
    assert f"resumed from {run.ckpt / 'step_000010'} (step 10" in run.output
    assert_same_run(run, reference)


def test_crash_inside_a_save_keeps_the_previous_checkpoint_and_the_restart_resumes_from_it(reference, tmp_path):
    run = launch_engine(
        tmp_path,
        "-n",
        "2",
        "--max-restarts",
        "1",
        overrides=("fault.rank=1", "fault.step=10", "fault.kind='crash-in-save'"),
    )
    assert "rank 1 crashes while saving the step-10 checkpoint" in run.output
    # the unfinished step-10 directory was never taken as latest: the restart went back to step 5
    assert f"resumed from {run.ckpt / 'step_000005'} (step 5" in run.output
    assert not [p for p in run.ckpt.iterdir() if LEFTOVER.match(p.name)]  # the next save cleaned it up
    assert_same_run(run, reference)


def test_hung_rank_is_ended_by_the_step_timeout_and_the_job_restarts(reference, tmp_path):
    run = launch_engine(
        tmp_path,
        "-n",
        "2",
        "--max-restarts",
        "1",
        overrides=("fault.rank=1", "fault.step=7", "fault.kind='hang'", "train.step_timeout=3"),
    )
    assert "rank 1 hangs at step 7" in run.output
    # the hung rank says it is the one, and goes first: its peers wait in a collective a little longer
    assert (
        "rank 1: step 7 did not finish within 3s (train.step_timeout): it is not waiting for other ranks" in run.output
    )
    assert "distlaunch: rank 1 on localhost exited with code 124" in run.output, run.output[-3000:]
    assert "exited with code 124" in run.output
    assert f"resumed from {run.ckpt / 'step_000005'} (step 5" in run.output
    assert_same_run(run, reference)
