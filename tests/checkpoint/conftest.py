"""Shared pieces of the checkpoint tests: run the engine through the real CLI, read what it left.

One uninterrupted reference job (2 ranks, dp=2, 20 steps, a checkpoint every 5) is run once per
session; the restart, hang, multi-host and export tests compare against it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
STEPS = 20
BASE = [
    "model.preset='tiny'",
    f"train.steps={STEPS}",
    "train.global_batch_size=4",
    "train.seq_len=32",
    "train.seed=7",
    "checkpoint.every=5",
    "checkpoint.keep=2",
]
SAME_LAYOUT_RTOL = 1e-6  # the bar for resuming on the same layout (measured: 0, bitwise equal)


def engine_args(ckpt_dir: Path, metrics: Path, *overrides: str) -> list[str]:
    """``-m distlaunch.engine`` with the base config, a checkpoint dir and a metrics file."""
    sets = [arg for o in [*BASE, f"checkpoint.dir='{ckpt_dir}'", *overrides] for arg in ("--set", o)]
    return ["-m", "distlaunch.engine", "--metrics-file", str(metrics), *sets]


def cli_env() -> dict[str, str]:
    """One thread per rank (2 shared cores), quiet warnings, the repo importable."""
    return {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}


def step_losses(metrics: Path) -> dict[int, float]:
    """Loss per step from metrics.jsonl; a step run twice (before and after a restart) keeps its last."""
    losses = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "step" in record:
            losses[record["step"]] = record["loss"]
    return losses


def max_relative(a: dict[int, float], b: dict[int, float]) -> float:
    """Largest relative difference over the steps of ``b``."""
    return max(abs(a[k] - b[k]) / abs(a[k]) for k in b)


@dataclass
class Run:
    """A finished engine job: its checkpoint dir, metrics and launcher output."""

    ckpt: Path
    metrics: Path
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Everything the launcher printed (rank stderr lines go to its stderr)."""
        return self.stdout + self.stderr

    @property
    def losses(self) -> dict[int, float]:
        return step_losses(self.metrics)


def launch_engine(tmp: Path, *launch: str, overrides: tuple[str, ...] = (), timeout: float = 180) -> Run:
    """``distlaunch run -n 2 LAUNCH... -m distlaunch.engine`` in a subprocess; fails on a non-zero exit."""
    ckpt, metrics = tmp / "ckpt", tmp / "metrics.jsonl"
    r = run_cli(
        "run",
        "--grace-period",
        "1",
        *launch,
        *engine_args(ckpt, metrics, *overrides),
        env=cli_env(),
        timeout=timeout,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Run(ckpt, metrics, r.stdout, r.stderr)


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> Run:
    """The uninterrupted job every recovered job must reproduce."""
    return launch_engine(tmp_path_factory.mktemp("reference"), "-n", "2")
