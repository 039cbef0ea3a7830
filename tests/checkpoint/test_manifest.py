"""The checkpoint directory rules, the resume decision, fault settings and the watchdog: pure
functions on temporary directories, plus one tiny process for the watchdog's exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distlaunch.engine.fault import FaultPlan
from distlaunch.engine.watchdog import STEP_TIMEOUT_EXIT
from distlaunch.errors import UsageError
from distlaunch.training.checkpoint.folder import (
    LATEST_FILE,
    META_FILE,
    latest_checkpoint,
    list_checkpoints,
    prune,
    publish,
    remove_leftovers,
    resolve_checkpoint,
)
from distlaunch.training.config import FaultSection
from distlaunch.training.faults import restart_count
from distlaunch.training.resume import resume_source


def save(root, step: int, tag: str = "job-r0"):
    """What a save does on disk: fill a temp dir, write the manifest last, publish."""
    tmp = root / f"step_{step:06d}.tmp-{tag}"
    tmp.mkdir(parents=True)
    (tmp / "__0_0.distcp").write_text("shard")
    (tmp / META_FILE).write_text("{}")
    return publish(root, tmp, step, tag)


def test_publish_renames_and_moves_latest_and_prune_keeps_the_newest(tmp_path):
    for step in (5, 10, 15):
        save(tmp_path, step)
    assert (tmp_path / LATEST_FILE).read_text() == "step_000015\n"
    assert prune(tmp_path, keep=2, tag="job-r0") == [tmp_path / "step_000005"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000010", "step_000015"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000010", "step_000015"]


def test_an_unfinished_save_is_never_latest_and_the_next_save_removes_it(tmp_path):
    save(tmp_path, 5)
    unfinished = tmp_path / "step_000010.tmp-job-r0"
    unfinished.mkdir()
    (unfinished / "__1_0.distcp").write_text("half")
    (unfinished / META_FILE).write_text("{}")  # even with a manifest: the name says unfinished
    assert latest_checkpoint(tmp_path) == resolve_checkpoint(tmp_path) == tmp_path / "step_000005"
    assert remove_leftovers(tmp_path) == [unfinished] and not unfinished.exists()


def test_latest_falls_back_to_the_newest_checkpoint_when_the_pointer_is_stale(tmp_path):
    save(tmp_path, 5)
    save(tmp_path, 10)
    (tmp_path / LATEST_FILE).write_text("step_000099\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000010"


def test_saving_a_step_again_replaces_it_and_points_latest_to_it(tmp_path):
    save(tmp_path, 5)
    save(tmp_path, 10)
    (tmp_path / "step_000005" / "__0_0.distcp").write_text("old")
    save(tmp_path, 5, tag="job-r1")  # resumed from an older checkpoint: the timeline moves back
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000005"
    assert (tmp_path / "step_000005" / "__0_0.distcp").read_text() == "shard"
    assert prune(tmp_path, keep=1, tag="job-r1") == []  # latest is kept even when older by number


@pytest.mark.parametrize(
    "resume,tries,expected",
    [
        ("auto", 0, "step_000010"),
        ("auto", 1, "step_000010"),
        ("latest", 0, "step_000010"),
        ("never", 1, "step_000010"),  # a restart continues the run (its first try found the folder empty)
        ("PATH", 0, "step_000005"),
        ("PATH", 1, "step_000010"),
    ],
)
def test_resume_source(tmp_path, resume, tries, expected):
    save(tmp_path, 5)
    save(tmp_path, 10)
    resume = str(tmp_path / "step_000005") if resume == "PATH" else resume
    found, warning = resume_source(resume, str(tmp_path), tries)
    assert warning is None
    assert (found.name if found else None) == expected


def test_never_is_a_fresh_run_in_a_folder_without_checkpoints(tmp_path):
    assert resume_source("never", str(tmp_path), 0) == (None, None)
    assert resume_source("never", None, 0) == (None, None)
    save(tmp_path, 35)
    save(tmp_path, 40)
    with pytest.raises(UsageError) as refused:
        resume_source("never", str(tmp_path), 0)
    assert f"checkpoint.dir {tmp_path} already holds 2 checkpoints of another run (step_000035 … step_000040)" in str(
        refused.value
    )
    assert "give this run a new checkpoint.dir" in refused.value.hint


def test_resume_errors_name_the_fix(tmp_path):
    assert resume_source("auto", str(tmp_path), 0) == (None, None)  # nothing yet: a fresh start
    with pytest.raises(UsageError, match="nothing to resume"):
        resume_source("latest", str(tmp_path), 0)
    assert resume_source("latest", str(tmp_path), 1) == (None, None)  # a restart before the first save
    with pytest.raises(UsageError, match="checkpoint not found"):
        resume_source(str(tmp_path / "missing"), str(tmp_path), 0)


def test_fault_fires_on_its_rank_on_the_first_try_only_unless_every_try():
    section = FaultSection(rank=1, step=12, kind="crash")
    assert FaultPlan.for_rank(section, 1, 2, tries=0, step_timeout=0) == FaultPlan("crash", 12)
    assert FaultPlan.for_rank(section, 0, 2, tries=0, step_timeout=0).kind is None
    assert FaultPlan.for_rank(section, 1, 2, tries=1, step_timeout=0).kind is None
    section.every_try = True
    assert FaultPlan.for_rank(section, 1, 2, tries=1, step_timeout=0).kind == "crash"
    assert restart_count({"DISTLAUNCH_RESTART_COUNT": "2"}) == 2 and restart_count({}) == 0


@pytest.mark.parametrize(
    "section,match",
    [
        (FaultSection(rank=1, step=3, kind="hang"), "would hang forever"),
        (FaultSection(rank=4, step=3), "the job has 2 rank"),
        (FaultSection(rank=1), "must be set together"),
    ],
)
def test_fault_settings_that_cannot_work_are_refused(section, match):
    with pytest.raises(UsageError, match=match):
        FaultPlan.for_rank(section, 0, 2, tries=0, step_timeout=0)


def test_watchdog_ends_a_stuck_process_with_its_exit_code_and_a_reason():
    code = (
        "import time; from distlaunch.engine.watchdog import Watchdog\n"
        "with Watchdog(3).guard('step 7', 0.3, 'train.step_timeout'):\n    time.sleep(30)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == STEP_TIMEOUT_EXIT
    stacks, reason = r.stderr.rstrip("\n").rsplit("\n", 1)  # the reason last: the root-cause table shows it
    assert reason.startswith(
        "error: rank 3: step 7 did not finish within 0.3s (train.step_timeout): it is not waiting for other ranks"
    ), r.stderr
    assert stacks.startswith("rank 3: Python stacks when step 7 ran out of time:")
    assert "time.sleep(30)" in stacks or "<string>" in stacks  # the stack of the stuck thread
