"""Which W&B run a start of a job logs to, and how far that run's history reaches: one job is one run.

The record, ``wandb-run.json`` (``{"run_id", "job", "logged_step"}``), lives where every attempt that
continues the job looks: ``checkpoint.dir`` (restarts, shrinks, spares, Slurm requeues and a rerun by hand all
resume from it), else the folder of metrics.jsonl (a restart of the same launch, which starts over from step 1).
A start takes the recorded run when

- it resumed a checkpoint of ``checkpoint.dir`` (that job's own run continues), or
- the record was written by the same launch (``DISTLAUNCH_JOB_ID``, or torchrun's ``--rdzv-id``): a restart
  before the first checkpoint,

and otherwise begins a new run, named after the launch's job id (``dl-...``) where there is one. WANDB_RUN_ID,
W&B's own setting, wins over both. ``logged_step`` is the highest step sent to the run (``WandbWriter.log``).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_FILE = "wandb-run.json"


@dataclass
class WandbRunRecord:
    """The job's W&B run: its id, the launch that last wrote the record, the highest step sent to it."""

    run_id: str
    job: str = ""
    logged_step: int = 0

    @classmethod
    def read(cls, store: Path | None) -> WandbRunRecord | None:
        """The record in ``store``, or None where there is none (or it is damaged: a new run then)."""
        if store is None:
            return None
        try:
            data = json.loads((store / RUN_FILE).read_text(encoding="utf-8"))
            return cls(str(data["run_id"]), str(data.get("job", "")), int(data.get("logged_step", 0)))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def save(self, store: Path | None) -> None:
        """Replace the record in ``store`` whole (written beside, then renamed: a crash leaves the old one or the
        new one). Not fsynced: it is written at every logged step, and only a host crash could lose it (then
        a resumed job may send a few steps twice, which W&B online drops)."""
        if store is None:
            return
        temporary = store / f"{RUN_FILE}.tmp"
        temporary.write_text(json.dumps(asdict(self)) + "\n", encoding="utf-8")
        os.replace(temporary, store / RUN_FILE)


def job_key(environ: Mapping[str, str]) -> str:
    """This launch's id: DISTLAUNCH_JOB_ID, else torchrun's run id (its default, "none", names no job)."""
    key = environ.get("DISTLAUNCH_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID") or ""
    return "" if key == "none" else key


def new_run_id(job: str) -> str:
    """A W&B run id for a new run: the job id where there is one (W&B refuses ``/\\#?%:`` in ids), else random."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", job)[:64] if job else uuid.uuid4().hex[:12]


def pick_run(store: Path | None, resumed: bool, environ: Mapping[str, str]) -> WandbRunRecord:
    """The run this start logs to (module docstring), with ``job`` set to this launch."""
    job = job_key(environ)
    stored = WandbRunRecord.read(store)
    run_id = environ.get("WANDB_RUN_ID", "")
    if not run_id and stored is not None and (resumed or (job and stored.job == job)):
        run_id = stored.run_id
    run_id = run_id or new_run_id(job)
    logged = stored.logged_step if stored is not None and stored.run_id == run_id else 0
    return WandbRunRecord(run_id, job, logged)
