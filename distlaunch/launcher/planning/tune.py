"""``--parallel auto --tune K``: the K fastest predicted layouts, each trained for a few steps by real ranks, their
measured step beside the predicted one, and the measured best, which the job then trains. The trials run through
the launch path of any training job (cli/tune.py); here is what a trial is and how it is judged. Torch-free.

A trial is the job itself with one layout, ``TRIAL_STEPS`` steps and a folder of its own: its metrics, its rank
logs and (where the job has a ``checkpoint.dir``, whose last step the engine always saves) its checkpoints go
there, and it resumes nothing: it never reads or writes the user's checkpoints, logs or trackers. Its step is
the median of rank 0's step times after the first (which carries the warm-up: imports, allocation, pipeline
shapes), read from the trial's metrics file; where rank 0 ran on a host whose files this machine does not see,
the launcher's own step timing of the attempt (``AttemptReport.step_s``), which needs steps of a second or more.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from pydantic import BaseModel, computed_field

from distlaunch.contract.report import RunReport
from distlaunch.errors import UsageError
from distlaunch.training.config import TrainingConfig

TRIAL_STEPS = 10


class Trial(BaseModel):
    """One layout's trial: what the cost model predicted, what the ranks measured, how the trial ended."""

    parallel: str  # the layout's --parallel spelling
    activation_checkpointing: bool
    predicted_s: float  # the cost model's step
    measured_s: float | None = None  # the trial's step; None: it failed, or no step time reached this machine
    exit_code: int = 0
    job_id: str | None = None
    folder: str  # its metrics.jsonl, rank logs (<job id>/) and checkpoints


class TuneResult(BaseModel):
    """Every trial, fastest predicted first, and which one the job trains."""

    steps: int  # each trial's
    folder: str
    trials: list[Trial]

    @computed_field
    @property
    def chosen(self) -> int | None:
        """The index of the trial the job trains: the measured best; where no trial's step time reached this
        machine, the fastest predicted that ran. None: every trial failed."""
        measured = [(t.measured_s, i) for i, t in enumerate(self.trials) if t.measured_s is not None]
        ran = [i for i, t in enumerate(self.trials) if t.exit_code == 0]
        return min(measured)[1] if measured else ran[0] if ran else None


def check_tune(tune: int | None, auto: bool, dry_run: bool, detach: bool) -> None:
    """``--tune K`` needs ``--parallel auto``, a K of 1 or more, and a launch that waits for its trials."""
    if tune is None:
        return
    if tune < 1:
        raise UsageError(f"--tune {tune}: at least one layout must be tried", "give --tune 1 or more, e.g. --tune 3")
    if not auto:
        raise UsageError(
            f"--tune {tune} measures the layouts that --parallel auto proposes, and this job has no --parallel auto",
            "add --parallel auto, or leave --tune out",
        )
    if dry_run:
        raise UsageError(
            f"--tune {tune} trains trial jobs, and --dry-run starts none",
            "drop --dry-run (--parallel auto --dry-run prints the predicted layouts without trying them)",
        )
    if detach:
        raise UsageError(
            f"--tune {tune} waits here for its trials, and --detach leaves the job to run in the background",
            "drop --detach, or tune first and detach the job with the --parallel it chose",
        )


def trial_sets(cfg: TrainingConfig, folder: Path) -> list[str]:
    """The ``--set`` assignments that make a trial of the job ``cfg``: a few steps, each one's time read from
    the device, no evaluation, no trackers, nothing resumed, checkpoints (if any) in the trial's folder."""
    sets = [f"train.steps={TRIAL_STEPS}", "train.eval_every=0", "train.log_every=1", "train.report_to="]
    sets.append("checkpoint.resume=never")
    if cfg.checkpoint.dir is not None:
        sets += [f"checkpoint.dir={json.dumps(str(folder / 'checkpoints'))}", "checkpoint.every=0"]
    return sets


def metrics_step_s(metrics: Path) -> float | None:
    """The median of rank 0's step times after the first, from its metrics.jsonl (None: not here, or no step
    after the first)."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    records = [json.loads(line) for line in lines if line.strip()]
    times = [r["step_time_s"] for r in records if r.get("step", 0) > 1 and r.get("step_time_s")]
    return statistics.median(times) if times else None


def trial_step_s(metrics: Path, report: RunReport) -> float | None:
    """A trial's measured step: from its metrics file where this machine sees it, else the launcher's timing."""
    if report.exit_code != 0:
        return None
    found = metrics_step_s(metrics)
    if found is not None or not report.attempts:
        return found
    return report.attempts[-1].step_s
