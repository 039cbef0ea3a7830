"""What distlaunch reads back from Slurm's tools: srun's failure lines, job states, and the sbatch template rule."""

from __future__ import annotations

import pytest

from distlaunch.errors import UsageError
from distlaunch.slurm.jobstate import exit_code_of, job_fields
from distlaunch.slurm.sbatch import output_path, render
from distlaunch.slurm.srun import TaskFailure, parse_failure, root_cause


@pytest.mark.parametrize(
    "line, failure",
    [
        ("srun: error: node2: task 2: Exited with exit code 7\n", TaskFailure(rank=2, node="node2", exit_code=7)),
        ("srun: error: gpu07: tasks 0-3: Exited with exit code 1", TaskFailure(rank=0, node="gpu07", exit_code=1)),
        ("srun: error: node1: tasks 0,2: Killed", TaskFailure(rank=0, node="node1", exit_code=137, signal="SIGKILL")),
        (
            "srun: error: node1: task 1: Segmentation fault (core dumped)",
            TaskFailure(rank=1, node="node1", exit_code=139, signal="SIGSEGV"),
        ),
        ("srun: error: node2: task 3: Terminated", TaskFailure(rank=3, node="node2", exit_code=143, signal="SIGTERM")),
        (  # the OOM killer (or the job's memory limit): the root cause, not an unknown line
            "srun: error: node1: task 0: Out Of Memory",
            TaskFailure(rank=0, node="node1", exit_code=137, signal="SIGKILL", out_of_memory=True),
        ),
    ],
)
def test_parse_failure(line, failure):
    assert parse_failure(line) == failure


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: node2: task 2: Exited with exit code 0",
        "2: srun: error: node2: task 2: Exited with exit code 7",  # a rank's own output, labelled by srun
        "srun: Force Terminated StepId=10.0",
        "srun: launch/slurm: _step_signal: Terminating StepId=10.0",
    ],
)
def test_other_lines_are_not_failures(line):
    assert parse_failure(line) is None


def test_root_cause_skips_the_ranks_srun_terminated():
    terminated = TaskFailure(rank=0, node="node1", exit_code=143, signal="SIGTERM")
    crashed = TaskFailure(rank=3, node="node2", exit_code=7)
    assert root_cause([terminated, crashed]) == crashed
    assert root_cause([terminated]) == terminated
    assert root_cause([]) is None


@pytest.mark.parametrize(
    "state, code, expected",
    [
        ("COMPLETED", "0:0", 0),
        ("FAILED", "7:0", 7),
        ("CANCELLED", "0:15", 143),
        ("TIMEOUT", "0:0", 1),
        ("OUT_OF_MEMORY", "0:125", 253),
        ("FAILED", "junk", 1),
    ],
)
def test_job_exit_codes(state, code, expected):
    assert exit_code_of(state, code) == expected


def test_job_fields_of_scontrol_one_liner():
    line = "JobId=12 JobName=allreduce UserId=root(0) JobState=FAILED Reason=NonZeroExitCode ExitCode=7:0 NodeList=node[1-2]"
    fields = job_fields(line)
    assert (fields["JobState"], fields["ExitCode"], fields["NodeList"]) == ("FAILED", "7:0", "node[1-2]")


def test_render_drops_lines_whose_placeholders_are_all_empty():
    template = "#SBATCH --time={{time}}\n#SBATCH --nodes={{nodes}}\nrun {{opts}} -- {{program}}\n# {{time}}{{nodes}}\n"
    values = {"time": "", "nodes": "2", "opts": "", "program": "train.py"}
    assert render(template, values) == "#SBATCH --nodes=2\nrun -- train.py\n# 2\n"
    with pytest.raises(UsageError, match=r"an unknown placeholder \{\{qos\}\}"):
        render("{{qos}}", values)


@pytest.mark.parametrize(
    "pattern, path",
    [
        (None, "slurm-12.out"),
        ("logs/%x-%j.out", "logs/train-12.out"),
        ("%A_%%.log", "12_%.log"),
        ("rank%t.out", None),
    ],
)
def test_output_path_of_a_job(pattern, path):
    assert output_path(pattern, "12", "train") == path
