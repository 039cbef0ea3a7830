"""Resume on a different layout, optimizer state included: dp4 -> dp2·tp2, tp2·pp2 -> dp4, zero3 -> zero1.

One 4-rank job (real processes, gloo) runs the phases one after the other through the real
training loop: three source layouts train 10 steps with a checkpoint at step 5 and 10; three
targets resume from a source's step-5 checkpoint and train steps 6-10. Each target must continue
the source's loss curve, and its step-10 checkpoint must hold the source's step-10 weights and
Adam moments, whatever layout wrote or read them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from distlaunch.engine.checkpoint.export import consolidated_state
from distlaunch.engine.model import GPT
from distlaunch.engine.presets import model_config
from tests.checkpoint.conftest import max_relative, step_losses
from tests.engine.harness import spawn

with torch.device("meta"):
    TINY_PARAMETERS = len(list(GPT(model_config("tiny")).parameters()))
RESHARD_RTOL = 1e-5  # the bar for a layout change (measured: <= 1.4e-7 on the loss)
STATE_RTOL, STATE_ATOL = 1e-4, 1e-7  # weights and Adam moments after 5 resumed steps (summation order differs)
BASE = [
    "model.preset='tiny'",
    "train.steps=10",
    "train.global_batch_size=8",
    "train.seq_len=32",
    "train.seed=7",
    "checkpoint.every=5",
    "checkpoint.keep=2",
]
SOURCES = {"dp4": [], "tp2-pp2": ["parallel.tp=2", "parallel.pp=2"], "zero3": ["parallel.zero=3"]}
CHANGES = {
    "dp4->dp2-tp2": ("dp4", ["parallel.tp=2"]),
    "tp2-pp2->dp4": ("tp2-pp2", []),
    "zero3->zero1": ("zero3", ["parallel.zero=1"]),
}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """Run every source and every target phase in one job; returns its output folder."""
    out = tmp_path_factory.mktemp("reshard")
    phases = {name: [f"checkpoint.dir='{out / name}'", *extra] for name, extra in SOURCES.items()}
    for name, (source, extra) in CHANGES.items():
        resume = f"checkpoint.resume='{out / source / 'step_000005'}'"
        phases[name] = [f"checkpoint.dir='{out / name}'", resume, *extra]
    spec = json.dumps({"base": BASE, "phases": phases})
    results = spawn([sys.executable, str(Path(__file__).with_name("_worker.py")), str(out), spec], 4, timeout=300)
    failed = [(i, r.stderr[-3000:]) for i, r in enumerate(results) if r.returncode != 0]
    assert not failed, f"rank {failed[0][0]} failed:\n{failed[0][1]}"
    return out


@pytest.mark.parametrize("change", list(CHANGES))
def test_layout_change_continues_the_loss_curve_with_the_optimizer_state(job, change):
    source = CHANGES[change][0]
    resumed = step_losses(job / f"{change}.jsonl")
    assert sorted(resumed) == [6, 7, 8, 9, 10]  # started after the step-5 checkpoint
    assert max_relative(step_losses(job / f"{source}.jsonl"), resumed) <= RESHARD_RTOL
    for prefix in ("model.", "optim."):  # optim.: exp_avg, exp_avg_sq and step of every parameter
        got = consolidated_state(job / change / "step_000010", prefix)
        want = consolidated_state(job / source / "step_000010", prefix)
        assert got.keys() == want.keys()
        assert prefix == "model." or sum(k.endswith(".exp_avg_sq") for k in want) == TINY_PARAMETERS  # every one
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=STATE_RTOL, atol=STATE_ATOL, msg=name)
