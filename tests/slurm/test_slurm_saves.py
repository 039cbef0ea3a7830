"""A batch job's saves as its ranks record them in the job's folder (slurm/saves.py), and the save signal as the
job's record keeps it: what ``distlaunch checkpoint slurm-N`` reads, never the job's output or its command line."""

from __future__ import annotations

import json
import math

import pytest

import distlaunch
from distlaunch.backends.slurm_batch import SlurmBatch, record_batch_job
from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError
from distlaunch.jobs.store import job_folder, read_record, write_record
from distlaunch.slurm.env import map_rank
from distlaunch.slurm.saves import SAVED_FILE_VAR, answered_step, saved_file, saved_steps
from distlaunch.slurm.step import read_step
from distlaunch.slurm.task import task_env
from tests.slurm.test_slurm_env import task_env as srun_task_env


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAUNCH_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def report(reports: distlaunch._ProgressFile, step: int, saved: int | None, save_s: float | None = None) -> None:
    reports.written_at = -math.inf
    reports.note(step, 0.1, saved, save_s)


def test_every_srun_task_is_told_its_record_in_the_batch_jobs_folder(state):
    env = task_env(map_rank(read_step(srun_task_env(3, 1, 1)), "gpu07"), LaunchOptions(program=["x.py"]), {})
    assert env[SAVED_FILE_VAR] == str(state / "jobs" / "slurm-42" / "saved" / "rank3.json")
    assert env[SAVED_FILE_VAR] == str(saved_file("slurm-42", 3))


def test_a_rank_records_each_newer_checkpoint_whole_in_a_recorded_jobs_folder(state, monkeypatch):
    record_batch_job("42", None, 2, 1, {}, ["distlaunch", "slurm", "sbatch"], "auto", save_signal="USR1")
    monkeypatch.setenv(SAVED_FILE_VAR, str(saved_file("slurm-42", 1)))
    monkeypatch.delenv("DISTLAUNCH_PROGRESS_FILE", raising=False)  # no agent under srun
    reports = distlaunch._ProgressFile()
    report(reports, 1, None)  # no checkpoint yet: nothing to record
    assert saved_steps("slurm-42") == {}
    report(reports, 2, 0)  # the engine's "the start" before its first save
    assert saved_steps("slurm-42") == {1: 0}
    report(reports, 3, 3, save_s=0.5)
    record = json.loads(saved_file("slurm-42", 1).read_text())
    assert (record["saved_step"], record["save_s"]) == (3, 0.5)
    first = saved_file("slurm-42", 1).stat().st_mtime_ns
    report(reports, 4, 3)  # the same checkpoint: the record stays as it is
    assert saved_file("slurm-42", 1).stat().st_mtime_ns == first
    assert sorted(p.name for p in saved_file("slurm-42", 1).parent.iterdir()) == ["rank1.json"]  # no .tmp left


def test_a_rank_of_a_job_nobody_recorded_makes_no_folder(state, monkeypatch):
    """srun inside salloc: the task is told a record, but no job folder exists, and none is made for it."""
    monkeypatch.setenv(SAVED_FILE_VAR, str(saved_file("slurm-77", 0)))
    report(distlaunch._ProgressFile(), 5, 5)
    assert not job_folder("slurm-77").exists()


@pytest.mark.parametrize(
    "before, now, step",
    [
        ({0: 4, 1: 4}, {0: 4, 1: 4}, None),  # nothing saved since the ask
        ({0: 4, 1: 4}, {0: 9, 1: 4}, None),  # rank 1 has not recorded it yet
        ({0: 4, 1: 4}, {0: 9, 1: 9}, 9),
        ({0: 4, 1: 4}, {0: 10, 1: 9}, 9),  # rank 0 saved again meanwhile (a periodic save): 9 is every rank's
        ({}, {0: 0, 1: 0}, None),  # the start reported before the first save is no checkpoint
        ({}, {0: 7}, 7),  # a program whose rank 0 alone reports its checkpoints
    ],
)
def test_a_save_is_done_once_every_recording_rank_has_saved_since_the_ask(before, now, step):
    assert answered_step(before, now) == step


def test_the_save_signal_is_the_one_recorded_at_submit_not_read_from_the_command_line(state):
    """Submitted with --save-signal none, in whatever spelling: the record says so, and checkpoint refuses before
    it signals anything."""
    command = ["distlaunch", "slurm", "sbatch", "train.py"]  # the flag is not where a parser would look
    record_batch_job("43", None, 2, 1, {}, command, "auto", save_signal=None)
    record = read_record(job_folder("slurm-43"))
    assert record.plan["save_signal"] is None
    write_record(record.model_copy(update={"state": "running"}))
    running = read_record(job_folder("slurm-43"))
    with pytest.raises(UsageError, match="submitted with --save-signal none"):
        SlurmBatch().checkpoint(running, "continue", timeout=1)
