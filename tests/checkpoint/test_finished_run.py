"""A checkpoint that already reaches ``train.steps`` (the same command run again after the job
finished) and one past it, through the real CLI: nothing left to train is one line and exit 0, a
checkpoint past the end is one line and exit 2 (in the launcher, and in the ranks where the launcher
does not look), never a traceback."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from distlaunch.engine.progress import summary_table
from distlaunch.training.checkpoint.folder import latest_checkpoint
from distlaunch.training.places import CHECKPOINT_LOCK
from tests.checkpoint.conftest import REPO, cli_env, engine_args
from tests.helpers import run_cli

SMALL = ["model.preset='tiny'", "train.global_batch_size=4", "train.seq_len=32", "train.seed=7", "checkpoint.every=2"]


def train(ckpt: Path, metrics: Path, steps: int) -> tuple[int, str, str]:
    """``distlaunch train -n 2 --parallel dp=2`` for ``steps`` steps, saving into ``ckpt``."""
    sets = [arg for o in [*SMALL, f"train.steps={steps}", f"checkpoint.dir='{ckpt}'"] for arg in ("--set", o)]
    r = run_cli(
        "train",
        "-n",
        "2",
        "--parallel",
        "dp=2",
        "--grace-period",
        "1",
        "--metrics-file",
        str(metrics),
        *sets,
        env=cli_env(),
        cwd=REPO,
        timeout=180,
    )
    return r.returncode, r.stdout, r.stderr


def test_running_a_finished_job_again_says_nothing_is_left_and_exits_0(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    code, out, err = train(ckpt, metrics, 4)
    assert code == 0, out[-2000:] + err[-2000:]
    lines = metrics.read_text()
    code, out, err = train(ckpt, metrics, 4)
    assert code == 0, out[-2000:] + err[-2000:]
    said = f"checkpoint {ckpt / 'step_000004'} (step 4) already reaches train.steps=4: nothing left to train"
    assert f"[rank 0] {said}" in out, out
    assert "Traceback" not in out + err and "continuing at step" not in out and "[rank 1]" not in out
    assert "training summary" not in out  # no step was run: no summary of nothing
    assert metrics.read_text() == lines  # the finished run's records and summary stay the last ones
    assert latest_checkpoint(ckpt) == ckpt / "step_000004"
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_LOCK, "latest", "step_000002", "step_000004"]


def test_a_checkpoint_past_train_steps_is_refused_before_and_inside_the_ranks(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    code, out, err = train(ckpt, metrics, 4)
    assert code == 0, out[-2000:] + err[-2000:]
    before = sorted(p.name for p in ckpt.iterdir())
    refusal = f"checkpoint {ckpt / 'step_000004'} is at step 4, past train.steps=3 (hint: set train.steps above 4"

    # distlaunch train: refused before any rank starts (it reads meta.json)
    code, out, err = train(ckpt, metrics, 3)
    assert code == 2 and err.startswith(f"error: {refusal}") and err.count("\n") == 1, out + err
    assert "[rank" not in out + err

    # the ranks themselves refuse it too (distlaunch run: no check before launch)
    r = run_cli(
        "run",
        "-n",
        "2",
        "--grace-period",
        "1",
        *engine_args(ckpt, metrics, *SMALL, "train.steps=3"),
        env=cli_env(),
        cwd=REPO,
        timeout=180,
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"[rank 0] error: {refusal}" in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr and "resumed from" not in r.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_a_summary_of_no_steps_shows_no_loss_instead_of_failing():
    summary = {
        "layout": "dp=1,tp=1,pp=1,zero=0",
        "world_size": 1,
        "preset": "tiny",
        "n_params": 887040,
        "precision": "fp32",
        "steps": 4,
        "first_loss": None,
        "final_loss": None,
        "final_val_loss": None,
        "tokens_per_s": 0.0,
        "mfu": None,
        "mem_bytes_per_rank": [{"total": 0}],
        "wall_s": 0.1,
    }
    console = Console(width=100, file=io.StringIO())
    console.print(summary_table(summary))
    shown = console.file.getvalue()
    assert "│ loss " in shown and "-> " not in shown
