"""After the ranks saved on request: requeue the batch job (``--requeue``), so that it resumes there, or say how.

``scontrol requeue $SLURM_JOB_ID`` puts the job back in the queue as the same job (same id, same output file with
``--open-mode=append``; ``scontrol show job`` counts ``Restarts=``) and ends this run of it: Slurm sends the batch
shell, which is this process, SIGTERM at once. So from here on distlaunch ignores SIGTERM and SIGHUP: it still
has to say what it did, and exit 75. Slurm holds a requeued job back for its credential lifetime
(``AuthInfo=cred_expire``, 120 s by default) before it starts again.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping

from distlaunch.contract.report import REQUEUE_CODE
from distlaunch.slurm.jobstate import SlurmUnanswered, said, slurm_command
from distlaunch.slurm.srun import SrunResult


def requeue_job(job_id: str) -> str | None:
    """``scontrol requeue JOB_ID``, bounded; None when Slurm took it, else why not (one line)."""
    try:
        done = slurm_command(["scontrol", "requeue", job_id])
    except FileNotFoundError:
        return "scontrol is not installed here"
    except SlurmUnanswered as exc:
        return exc.message
    if done.returncode:
        return said(done) or f"scontrol requeue exited {done.returncode}"
    return None


def _outlive_the_requeue() -> None:
    """Slurm ends the requeued run with SIGTERM to the batch shell (this process) right after it takes the requeue:
    ignored for the rest of this process, which only reports and exits."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


def settle(result: SrunResult, requeue: bool, environ: Mapping[str, str]) -> SrunResult:
    """The job's outcome once the ranks saved as asked: requeued (``requeue`` inside a batch job) with exit 75; else
    exit 75 after the save signal, 143 after a SIGTERM. Anything else is left as it is."""
    if not result.saved or not requeue:
        return result
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        return result.model_copy(
            update={"exit_code": REQUEUE_CODE, "requeue_error": "not inside a Slurm batch job (no SLURM_JOB_ID)"}
        )
    _outlive_the_requeue()
    error = requeue_job(job_id)
    return result.model_copy(update={"exit_code": REQUEUE_CODE, "requeued": error is None, "requeue_error": error})
