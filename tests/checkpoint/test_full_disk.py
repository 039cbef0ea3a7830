"""A checkpoint save that meets a full disk: one line and the earlier checkpoints intact, on a real
small filesystem (a tmpfs this test mounts and unmounts)."""

from __future__ import annotations

import pytest

from distlaunch.training.checkpoint.folder import list_checkpoints
from tests.checkpoint.conftest import REPO, cli_env, engine_args
from tests.fixtures.tmpfs import small_disk as mounted
from tests.helpers import run_cli


@pytest.fixture
def small_disk(tmp_path):
    """A 12 MiB filesystem: room for the first checkpoint of the tiny model (~10.5 MiB), not a second."""
    with mounted(tmp_path / "small", "12m") as where:
        yield where


def test_a_save_on_a_full_disk_is_one_line_and_keeps_the_checkpoint_before_it(tmp_path, small_disk):
    ckpt = small_disk / "ckpt"
    args = engine_args(ckpt, tmp_path / "m.jsonl", "train.steps=4", "checkpoint.every=2", "checkpoint.keep=2")
    r = run_cli("run", "--grace-period", "1", "-n", "1", *args, env=cli_env(), cwd=REPO, timeout=180)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "the checkpoint of step 4 could not be written to" in out and "no space left on the device" in out, out
    assert "Traceback" not in out and "unexpected pos" not in out, out
    assert [p.name for p in list_checkpoints(ckpt)] == ["step_000002"]  # step 4 was never published
