"""A batch job's saved checkpoints, as its ranks record them in the job's folder.

Under srun no agent reads a rank's progress, so every rank of a job that ``distlaunch slurm sbatch`` recorded
replaces a small record of its own each time it reports a newer checkpoint (``distlaunch.progress(saved_step=...)``,
as under every other backend):

    jobs/slurm-<id>/saved/rank<N>.json      {"saved_step": 120, "save_s": 2.1, "at": 1795552340.5}

The rank finds the file in ``$DISTLAUNCH_SAVED_FILE`` (``slurm/task.py``); ``distlaunch checkpoint slurm-N`` and
``stop --checkpoint`` read every rank's (``SlurmBatch.checkpoint``). The ranks resolve the job's folder as the
command that submitted it did: the job inherits its environment (``$DISTLAUNCH_STATE_DIR``, else the home folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from distlaunch.jobs.store import job_folder
from distlaunch.slurm.env import SlurmRank

SAVED_FILE_VAR = "DISTLAUNCH_SAVED_FILE"
SAVED_DIR = "saved"
_RANK_FILE = re.compile(r"^rank(\d+)\.json$")


def batch_job_id(slurm_id: str) -> str:
    """The record of Slurm batch job ``slurm_id``: ``slurm-<id>``."""
    return f"slurm-{slurm_id}"


def saved_file(job_id: str, rank: int) -> Path:
    """Where rank ``rank`` of the recorded job ``job_id`` records its newest checkpoint."""
    return job_folder(job_id) / SAVED_DIR / f"rank{rank}.json"


def saved_file_env(rank: SlurmRank) -> dict[str, str]:
    """An srun task's ``DISTLAUNCH_SAVED_FILE``: its record in the folder of the batch job its step runs in (the
    rank's job id is ``slurm-<job>.<step>``, the batch job's record ``slurm-<job>``), written only where distlaunch
    recorded that job."""
    batch_job = rank.job_id.rsplit(".", 1)[0]
    return {SAVED_FILE_VAR: str(saved_file(batch_job, rank.rank))}


def saved_steps(job_id: str) -> dict[int, int]:
    """Each recording rank's newest saved step (rank -> step); a record that cannot be read is left out."""
    steps = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(job_folder(job_id) / SAVED_DIR):
            found = _RANK_FILE.match(entry.name)
            if not found:
                continue  # a record still being written (.tmp)
            step = _saved_step(Path(entry.path))
            if step is not None:
                steps[int(found[1])] = step
    return steps


def _saved_step(path: Path) -> int | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    step = raw.get("saved_step") if isinstance(raw, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def answered_step(before: Mapping[int, int], now: Mapping[int, int]) -> int | None:
    """The step every recording rank has saved since ``before`` (what they recorded when the save was asked), once
    they all have; else None. A rank that saved that step reports it at its own moment: until the last one has,
    the save is not done. A rank that had recorded nothing was at the start (step 0, as a rank reports before its
    first checkpoint)."""
    newer = [step for rank, step in now.items() if step > before.get(rank, 0)]
    if not newer:
        return None
    step = min(newer)
    return step if all(other >= step for other in now.values()) else None
