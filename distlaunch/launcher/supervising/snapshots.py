"""``distlaunch stacks JOB``: every rank's stack from a running job, on demand, the job running on.

The command leaves a request in the job's folder (launcher/supervising/requests.py) after checking that the record's
launcher is still that process (pid and start time). The launcher asks its agents for stacks exactly as on a
hang and writes a new numbered snapshot into the job's folder, never replacing an earlier one:

    jobs/<job id>/stacks-1/rank<N>.txt   every rank's full stack
    jobs/<job id>/stacks-1.json          a StacksSnapshot: where each group of ranks waits (written last)
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from distlaunch.contract.report import StacksSnapshot
from distlaunch.errors import NoAnswer, UsageError
from distlaunch.jobs.store import JobRecord, job_folder
from distlaunch.launcher.supervising.requests import post_request
from distlaunch.launcher.supervising.stacks import summarise_stacks, write_rank_stacks

POLL_S = 0.1
_NUMBERED = re.compile(r"^stacks-(\d+)$")


def _numbers(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return [int(m[1]) for p in folder.iterdir() if (m := _NUMBERED.match(p.name.removesuffix(".json")))]


def write_snapshot(folder: Path, job_id: str, stacks: dict[int, dict], host_of: dict[int, str]) -> StacksSnapshot:
    """In the launcher: write the stacks as the next numbered snapshot in ``folder``, the summary last."""
    number = max(_numbers(folder), default=0) + 1
    while True:
        target = folder / f"stacks-{number}"
        try:
            target.mkdir(mode=0o700)  # claims the number: an earlier snapshot is never written over
            break
        except FileExistsError:
            number += 1
    write_rank_stacks(target, stacks, host_of)
    groups, text = summarise_stacks(stacks, host_of)
    snapshot = StacksSnapshot(job_id=job_id, number=number, summary=text, groups=groups, folder=str(target))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stacks-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(snapshot.model_dump_json(indent=1))
    os.replace(tmp, folder / f"stacks-{number}.json")  # a reader sees the whole summary or none
    return snapshot


# What to use instead where distlaunch does not run the job's launcher itself.
_ELSEWHERE = {
    "slurm": "run py-spy dump --pid PID on its nodes (srun --jobid ID --overlap); for distlaunch train, "
    "train.step_timeout prints a hung rank's stacks by itself",
    "k8s": "run py-spy dump --pid PID in its pods (kubectl exec POD -- ...), or submit with --hang-timeout",
}


def request_stacks(record: JobRecord, timeout: float) -> StacksSnapshot:
    """Ask the job's launcher for its ranks' stacks and wait (up to ``timeout`` s) for the snapshot."""
    if record.backend in _ELSEWHERE:
        raise UsageError(
            f"job {record.job_id} is a {record.backend} job: distlaunch stacks reaches only jobs of run and train",
            _ELSEWHERE[record.backend],
        )
    folder = job_folder(record.job_id)
    seen = max(_numbers(folder), default=0)
    post_request(record, "stacks")  # refused for a job that ended, is lost, or runs on another machine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newer = [n for n in _numbers(folder) if n > seen and (folder / f"stacks-{n}.json").exists()]
        if newer:
            return StacksSnapshot.model_validate_json((folder / f"stacks-{min(newer)}.json").read_bytes())
        time.sleep(POLL_S)
    raise NoAnswer(
        f"job {record.job_id} did not answer with its stacks within {timeout:g}s",
        f"try a longer --timeout, or see 'distlaunch logs {record.job_id}'",
    )
