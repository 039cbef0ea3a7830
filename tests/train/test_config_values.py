"""Config values that used to slip through: non-finite numbers, timeouts past what the watchdog can
wait, a min_lr above lr, a seed torch cannot take, empty paths, true in a number key, --gpu-memory 0.
Each is one line and exit 2 from ``distlaunch train`` before any rank starts (the real CLI, in-process)."""

from __future__ import annotations

import json

import pytest

from distlaunch.errors import UsageError
from distlaunch.training.config import load_config
from tests.helpers import invoke


def refused(args: list[str], *words: str) -> str:
    """``distlaunch train -n 1 --dry-run ARGS`` is exit 2 with one ``error: … (hint: …)`` line holding ``words``."""
    result = invoke(["train", "-n", "1", "--dry-run", *args])
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], result.stderr
    assert "internal error" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "assignment,words",
    [
        # past threading.TIMEOUT_MAX the watchdog thread died, and a hang then hung forever
        ("checkpoint.timeout=1e10", ["checkpoint.timeout: 10000000000.0", "less than or equal to 2592000", "0 turns"]),
        ("checkpoint.timeout=inf", ["checkpoint.timeout: inf", "finite"]),
        ("train.step_timeout=1e10", ["train.step_timeout", "less than or equal to 2592000"]),
        ("train.step_timeout=inf", ["train.step_timeout: inf", "finite"]),
        ("train.step_timeout=nan", ["train.step_timeout: nan", "finite"]),
        ("train.lr=inf", ["train.lr: inf", "finite"]),  # trained to a nan loss and exited 0
        ("train.loss_scale=inf", ["train.loss_scale: inf", "finite"]),
        ("train.grad_clip=inf", ["train.grad_clip: inf", "finite"]),
        ("train.weight_decay=nan", ["train.weight_decay: nan", "finite"]),
        ("train.bucket_mb=inf", ["train.bucket_mb: inf", "finite"]),  # was an internal OverflowError, exit 1
        ("train.bucket_mb=1e6", ["train.bucket_mb", "less than or equal to 65536"]),
        ("data.val_fraction=nan", ["data.val_fraction: nan", "finite"]),
        ("train.seed=99999999999999999999", ["train.seed", "less than 4294967296"]),  # a rank traceback before
        ("train.seed=4294967296", ["train.seed", "less than 4294967296"]),
        # an empty path is the current folder: checkpoints landed there
        ("checkpoint.dir=", ["checkpoint.dir: ''", "leave the key out for no checkpoints"]),
        ("checkpoint.dir=' '", ["checkpoint.dir: ' '", "an empty path"]),
        ("data.path=", ["data.path: ''", "leave the key out for the bundled corpus"]),
        # true is 1 to pydantic: steps=true trained one step
        ("train.steps=true", ["train.steps: True", "not true or false"]),
        # and a switch takes only true or false: 1 and yes were taken as true
        ("train.activation_checkpointing=1", ["train.activation_checkpointing: 1", "true or false is needed"]),
        ("train.compile=yes", ["train.compile: 'yes'", "true, false or 'auto' is needed"]),  # auto is one too
        ("fault.every_try=0", ["fault.every_try: 0", "true or false is needed"]),
        ("train.global_batch_size=true", ["train.global_batch_size: True", "not true or false"]),
        ("train.micro_batch_size=true", ["train.micro_batch_size: True", "not true or false"]),
        ("train.seq_len=true", ["train.seq_len: True", "not true or false"]),
        ("train.grad_accum_steps=true", ["train.grad_accum_steps: True", "not true or false"]),
        ("train.eval_batches=true", ["train.eval_batches: True", "not true or false"]),
        ("train.log_every=true", ["train.log_every: True", "not true or false"]),
        ("train.lr=true", ["train.lr: True", "not true or false"]),
        ("checkpoint.every=true", ["checkpoint.every: True", "not true or false"]),
        ("checkpoint.keep=true", ["checkpoint.keep: True", "not true or false"]),
        ("parallel.zero=true", ["parallel.zero: True", "not true or false"]),
        ("parallel.microbatches=true", ["parallel.microbatches: True", "not true or false"]),
        ("fault.step=true", ["fault.step: True", "not true or false"]),
    ],
)
def test_bad_values_are_one_line_and_exit_2(assignment, words):
    refused(["--set", assignment], "bad value for", *words)


def test_min_lr_above_lr_is_refused_against_the_lr_the_job_trains_with(tmp_path):
    line = refused(["--set", "train.min_lr=0.5", "--set", "train.lr=0.001"], "train.min_lr=0.5", "train.lr=0.001")
    assert "climb" in line and "at most 0.001" in line
    # no lr given: the default (3e-3), the embedded config's as every other config's, is the one it is checked against
    refused(["--set", "train.min_lr=0.004"], "train.min_lr=0.004 is above train.lr=0.003")
    assert invoke(["train", "-n", "1", "--dry-run", "--set", "train.min_lr=0.002"]).exit_code == 0
    assert invoke(["train", "-n", "1", "--dry-run", "--set", "train.min_lr=0.003"]).exit_code == 0  # equal: constant
    mine = tmp_path / "mine.toml"
    mine.write_text("[train]\nmin_lr = 0.01\n")  # the default lr, 3e-3, is the one this file trains with
    refused([str(mine)], "train.min_lr=0.01 is above train.lr=0.003")


@pytest.mark.parametrize("size", ["0", "0GiB", "0.1"])
def test_gpu_memory_must_be_positive(size):
    refused(["--gpu-memory", size], f"--gpu-memory {size!r} is not a positive size", "80GiB")


def test_unknown_gpu_memory_is_said_in_plain_words(monkeypatch):
    monkeypatch.setattr("distlaunch.launcher.planning.decisions.inventory", dict)  # a host without GPUs
    result = invoke(["train", "-n", "1", "--dry-run", "--backend", "nccl"])
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps at 100 columns
    assert "memory per rank unknown (pass --gpu-memory, e.g. --gpu-memory 80GiB)" in text
    assert "cannot tell whether the step peak fits" in text and "peak cannot tell" not in text
    assert (
        json.loads(invoke(["train", "-n", "1", "--dry-run", "--backend", "nccl", "--json"]).stdout)["memory"]["fits"]
        is None
    )


def test_good_values_still_load(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        "[train]\nsteps = 7\nlr = 1\nmin_lr = 0.5\nseed = 4294967295\nstep_timeout = 2592000\n"
        '[checkpoint]\ndir = "."\ntimeout = 0\n[data]\npath = "corpus.txt"\n'
    )
    cfg = load_config(path)
    assert (cfg.train.steps, cfg.train.lr, cfg.train.seed) == (7, 1.0, 2**32 - 1)
    assert (cfg.checkpoint.dir, cfg.checkpoint.timeout, cfg.data.path) == (".", 0.0, "corpus.txt")
    # --set values are TOML: a float that is a whole number still counts, and a bare .5 (a string) is a number
    cfg = load_config(None, ["train.steps=1e2", "train.lr=.5", "parallel.dp=auto", "train.micro_batch_size=auto"])
    assert (cfg.train.steps, cfg.train.lr, cfg.parallel.dp, cfg.train.micro_batch_size) == (100, 0.5, None, None)
    assert load_config(None, ["train.compile=true", "train.activation_checkpointing=true"]).train.compile is True
    with pytest.raises(UsageError, match="fractional"):
        load_config(None, ["train.steps=1.5"])


@pytest.mark.parametrize(
    "sets,words",
    [
        (["fault.rank=1", "fault.step=1"], ["fault.rank=1 but the job has 1 rank"]),
        (
            ["fault.kind='hang'", "fault.rank=0", "fault.step=1", "train.step_timeout=0"],
            ["fault.kind='hang' with train.step_timeout=0 would hang forever"],
        ),
        (
            ["fault.kind='slow'", "fault.rank=0", "fault.step=1", "fault.factor=0.5"],
            ["fault.factor=0.5 would not slow rank 0 down", "a factor above 1"],
        ),
    ],
)
def test_a_fault_the_job_cannot_inject_is_refused_before_any_rank_starts(sets, words):
    refused([arg for s in sets for arg in ("--set", s)], *words)  # before: each rank refused it, seconds in


def test_a_set_without_its_equals_sign_is_named_not_taken_for_a_missing_config_file():
    # `--set train.steps 50`: 50 lands where CONFIG goes; the --set is what is wrong
    line = refused(["--set", "train.steps", "50"], "bad --set 'train.steps': expected section.key=value")
    assert "config file" not in line
    assert invoke(["train", "-n", "1", "--dry-run", "--set", "train.compile=auto"]).exit_code == 0
