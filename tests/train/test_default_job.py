"""The README's main job, shortened: ``distlaunch train`` on the embedded default, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.engine.harness import REPO, spawn
from tests.helpers import distlaunch_cmd, run_cli

STEP_KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes"}


def test_embedded_default_trains_on_4_processes(tmp_path):
    args = [
        "train",
        "--set",
        "train.steps=20",
        "--set",
        "train.warmup_steps=2",
        "--set",
        "train.eval_every=10",
        "--log-dir",
        str(tmp_path),
    ]
    run = subprocess.run(
        distlaunch_cmd(*args),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[rank 0] step 20/20  loss" in run.stdout and "training summary" in run.stdout
    assert "[rank 1]" not in run.stdout  # only rank 0 reports
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "step" in r]
    assert [r["step"] for r in steps] == list(range(1, 21)) and all(set(r) >= STEP_KEYS for r in steps)
    assert all(r["mfu"] is None for r in steps)  # no known peak on a CPU
    assert [r["step"] for r in steps if "val_loss" in r] == [10, 20]
    summary = records[-1]
    assert summary["event"] == "summary" and summary["layout"] == "dp=2,tp=1,pp=2,zero=1"
    assert summary["final_loss"] < summary["first_loss"] - 1.0, summary
    assert list(tmp_path.glob("dl-*/rank0.log")) and len(summary["mem_bytes_per_rank"]) == 4


def test_a_users_text_file_and_a_bad_token_file(tmp_path):
    text = tmp_path / "shakespeare.txt"
    text.write_text("To be, or not to be, that is the question. " * 200)
    engine = [
        sys.executable,
        "-m",
        "distlaunch.engine",
        "--set",
        "train.steps=2",
        "--set",
        "train.seq_len=32",
        "--set",
        "train.global_batch_size=4",
    ]
    (ok,) = spawn([*engine, "--set", f"data.path='{text}'"], world_size=0, timeout=120)
    assert ok.returncode == 0 and "step 2/2" in ok.stdout, ok.stderr
    tokens = tmp_path / "tokens.bin"
    tokens.write_bytes(b"\x00\x01" * 4000)  # uint16 little-endian 256: outside the byte vocabulary
    (bad,) = spawn([*engine, "--set", f"data.path='{tokens}'"], world_size=0, timeout=120)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "token id 256" in lines[0] and "vocabulary of 256" in lines[0]


def test_a_layout_on_the_command_line_runs_for_real(tmp_path):
    """`train --parallel tp=2` replaces the embedded dp=2 x pp=2: 2 processes, one tensor-parallel pair."""
    args = ["train", "--parallel", "tp=2", "--set", "train.steps=3", "--set", "train.eval_every=0"]
    run = subprocess.run(
        distlaunch_cmd(*args, "--metrics-file", str(tmp_path / "m.jsonl")),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[-1])
    assert summary["layout"] == "dp=1,tp=2,pp=1,zero=1" and len(summary["mem_bytes_per_rank"]) == 2
    assert "2 ranks exited 0" in run.stdout + run.stderr


def test_fp16_overflow_reads_as_skipped_steps_without_torch_warnings(tmp_path):
    """Every fp16 step overflows (a loss scale no gradient survives): each step line says it was
    skipped, and no rank prints torch's scheduler-before-optimizer warning, which would tell users
    to reorder calls they never made. On 3 ranks, which the embedded batch of 16 does not split over: every
    rank trains the batch the plan chose and said (18 sequences)."""
    sets = ["train.precision='fp16'", "train.loss_scale=1e30", "train.steps=2", "train.log_every=1"]
    args = ["train", "--parallel", "dp=3,tp=1,pp=1,zero=0", "--set", "train.eval_every=0"]
    for assignment in sets:
        args += ["--set", assignment]
    run = run_cli(*args, "--metrics-file", str(tmp_path / "m.jsonl"), timeout=240, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("skipped (fp16 overflow, loss scale halved)") == 2, run.stdout
    assert "Warning" not in run.stdout + run.stderr, run.stdout + run.stderr
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert records[-1]["skipped_steps"] == 2
    assert "distlaunch: batch: 18 sequences per step" in run.stderr, run.stderr
    assert records[0]["config"]["train"]["global_batch_size"] == 18  # what the ranks trained, as they report it
