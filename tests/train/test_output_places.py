"""Where a job writes (``checkpoint.dir``, the metrics file) is checked at the start, not found at
the first save after hours of training: in ``distlaunch train`` before any rank starts (without
creating anything, ``--dry-run`` too), and by rank 0 before step 1 where the launcher does not
look. One line naming the path and why, exit 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distlaunch.errors import UsageError
from distlaunch.launcher.planning.train import check_training_files
from distlaunch.training.config import load_config
from distlaunch.training.places import CHECKPOINT_LOCK, METRICS_FILE, place_problem
from tests.checkpoint.conftest import cli_env
from tests.helpers import invoke, run_cli

SMALL = ["model.preset='tiny'", "train.steps=2", "train.global_batch_size=4", "train.seq_len=32"]
CKPT_FIX = "(hint: point checkpoint.dir at a folder you can write; missing folders are created)"
METRICS_FIX = "(hint: point --metrics-file or --log-dir at a place you can write; missing folders are created)"


def sets(*extra: str) -> list[str]:
    return [arg for o in [*SMALL, *extra] for arg in ("--set", o)]


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("dry_run", [False, True])
def test_train_refuses_a_checkpoint_dir_it_cannot_create_before_any_rank_starts(tmp_path, a_file, dry_run):
    cases = {
        a_file / "ckpt": f"checkpoint.dir {a_file / 'ckpt'} cannot be created: {a_file} is a file, not a folder",
        a_file / "deeper" / "ckpt": f"cannot be created: {a_file} is a file, not a folder",
        a_file: f"checkpoint.dir {a_file} is a file, not a folder",
    }
    for ckpt, expected in cases.items():
        args = ["train", "-n", "2", *sets(f"checkpoint.dir='{ckpt}'"), *(["--dry-run"] if dry_run else [])]
        r = invoke(args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, (ckpt, r.stdout[-2000:], r.stderr)
        assert r.stderr.startswith("error: checkpoint.dir ") and expected in r.stderr and CKPT_FIX in r.stderr
        assert "[rank" not in r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_dry_run_creates_no_checkpoint_dir(tmp_path):
    ckpt = tmp_path / "new" / "ckpt"
    r = invoke(["train", "-n", "2", "--dry-run", *sets(f"checkpoint.dir='{ckpt}'")])
    assert r.exit_code == 0, r.stderr
    assert not (tmp_path / "new").exists()


def engine_job(tmp_path: Path, *args: str) -> tuple[int, str]:
    """``distlaunch run -n 2 -m distlaunch.engine ARGS`` (no check before launch: the ranks decide)."""
    r = run_cli(
        "run",
        "-n",
        "2",
        "--grace-period",
        "1",
        "-m",
        "distlaunch.engine",
        *args,
        env=cli_env(),
        cwd=tmp_path,
        timeout=180,
    )
    return r.returncode, r.stdout + r.stderr


def assert_refused_at_start(code: int, output: str, expected: str) -> None:
    assert code == 2, output[-3000:]
    assert f"[rank 0] error: {expected}" in output and f"[rank 1] error: {expected}" in output, output[-3000:]
    assert "Traceback" not in output and "step 1/" not in output  # before the first step, as one line


def test_rank_0_refuses_a_checkpoint_dir_it_cannot_create_before_the_first_step(tmp_path, a_file):
    code, output = engine_job(tmp_path, *sets(f"checkpoint.dir='{a_file / 'ckpt'}'"))
    expected = f"checkpoint.dir {a_file / 'ckpt'} cannot be created: {a_file} is a file, not a folder {CKPT_FIX}"
    assert_refused_at_start(code, output, expected)
    # what no check foresees (a special filesystem): the system's reason, still one line
    code, output = engine_job(tmp_path, *sets("checkpoint.dir='/proc/distlaunch-test/ckpt'"))
    assert_refused_at_start(code, output, "checkpoint.dir /proc/distlaunch-test/ckpt cannot be created: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_rank_0_creates_the_checkpoint_dir_before_the_first_step(tmp_path):
    ckpt = tmp_path / "runs" / "ckpt"
    crash = ["fault.rank=0", "fault.step=1", "fault.kind='crash'"]
    code, output = engine_job(tmp_path, *sets(f"checkpoint.dir='{ckpt}'", *crash))
    assert code == 42, output[-3000:]
    assert ckpt.is_dir() and [p.name for p in ckpt.iterdir()] == [CHECKPOINT_LOCK]  # made at the start, held


def test_rank_0_refuses_a_metrics_file_it_cannot_write_before_the_first_step(tmp_path, a_file):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cases = {
        folder: f"metrics file {folder} is a folder, not a file",
        a_file / "metrics.jsonl": f"metrics file {a_file / 'metrics.jsonl'} cannot be created: {a_file} is a file, "
        "not a folder",
        Path("/proc/distlaunch-test/metrics.jsonl"): "metrics file /proc/distlaunch-test/metrics.jsonl cannot be "
        "written: ",
    }
    for metrics, expected in cases.items():
        code, output = engine_job(tmp_path, "--metrics-file", str(metrics), *sets())
        assert_refused_at_start(code, output, expected)
        assert METRICS_FIX in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder"] and not list(folder.iterdir())


def test_a_place_without_write_permission_is_named(tmp_path, monkeypatch):
    """root may write anywhere, so the permission is taken away from the check itself."""
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    assert place_problem(tmp_path / "ckpt", folder=True) == f"cannot be created: {tmp_path} is not writable"
    assert place_problem(tmp_path / "a" / "b", folder=True) == f"cannot be created: {tmp_path} is not writable"
    assert place_problem(tmp_path, folder=True) == "is not writable"
    assert place_problem(tmp_path / "m.jsonl", folder=False) == f"cannot be created: {tmp_path} is not writable"


def test_the_launcher_checks_a_metrics_file_it_is_given_without_creating_anything(tmp_path, a_file):
    cfg = load_config(None, SMALL)
    for metrics in (tmp_path, a_file / "m.jsonl"):
        with pytest.raises(UsageError) as refused:
            check_training_files(cfg, None, None, metrics)
        assert str(refused.value).startswith(f"{METRICS_FILE} {metrics} ")
    check_training_files(cfg, None, None, tmp_path / "new" / "m.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_train_refuses_a_metrics_file_that_is_a_folder_before_any_rank_starts(tmp_path):
    r = invoke(["train", "--dry-run", "-n", "1", "--parallel", "dp=1", "--metrics-file", str(tmp_path)])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"error: {METRICS_FILE} {tmp_path} "), r.stderr


@pytest.mark.parametrize("name", ["latest", "latest.tmp"])
def test_a_folder_named_as_the_pointer_in_the_checkpoint_dir_is_refused_before_the_first_save(tmp_path, name):
    (tmp_path / "ckpt" / name).mkdir(parents=True)  # before: trained, then failed to publish its pointer
    r = invoke(["train", "--dry-run", "-n", "1", "--parallel", "dp=1", *sets(f"checkpoint.dir='{tmp_path / 'ckpt'}'")])
    assert r.exit_code == 2, r.stdout + r.stderr
    assert f"checkpoint.dir {tmp_path / 'ckpt'} holds a folder named {name}, " in r.stderr, r.stderr


def test_a_file_in_a_step_folders_place_is_replaced_by_the_save_and_leaves_nothing_behind(tmp_path):
    from distlaunch.training.checkpoint.folder import publish

    (tmp_path / "step_000006").write_text("not a checkpoint")
    (tmp_path / "step_000006.tmp-ab").mkdir()
    (tmp_path / "step_000006.tmp-ab" / "meta.json").write_text("{}")
    publish(tmp_path, tmp_path / "step_000006.tmp-ab", 6, "ab")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000006"]  # before: a .trash-ab file too
    assert (tmp_path / "step_000006" / "meta.json").is_file()
