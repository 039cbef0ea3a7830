"""Follow a batch job to its end through ``scontrol show job`` (``sacct`` once slurmctld has forgotten it)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from distlaunch.errors import HostError

SLURM_CMD_TIMEOUT_S = 60
POLL_FIRST_S, POLL_MAX_S = 0.5, 5.0  # quick for short jobs, gentle on slurmctld for long ones
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REVOKED",
}
_FIELD = re.compile(r"(\w+)=(\S*)")


def job_fields(text: str) -> dict[str, str]:
    """``Key=Value`` fields of ``scontrol show job -o`` (first occurrence of each key)."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(text):
        fields.setdefault(key, value)
    return fields


def exit_code_of(state: str, exit_code: str) -> int:
    """Slurm's ``CODE:SIGNAL`` as a process exit code (128+SIGNAL when killed); a failed state is never 0."""
    code, _, sig = exit_code.partition(":")
    value = 128 + int(sig) if sig.isdigit() and int(sig) else int(code) if code.isdigit() else 1
    return value if value or state == "COMPLETED" else 1


def _scontrol_state(job_id: str) -> tuple[str, str] | None:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        timeout=SLURM_CMD_TIMEOUT_S,
        check=False,
    )
    fields = job_fields(out.stdout) if out.returncode == 0 else {}
    return (fields["JobState"], fields.get("ExitCode", "0:0")) if "JobState" in fields else None


def _sacct_state(job_id: str) -> tuple[str, str] | None:
    try:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"],
            capture_output=True,
            text=True,
            timeout=SLURM_CMD_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    if not lines or "|" not in lines[0]:
        return None
    state, exit_code = lines[0].split("|")[:2]
    return state.split()[0], exit_code  # "CANCELLED by 0" → CANCELLED


def job_state(job_id: str) -> tuple[str, str] | None:
    """A batch job's Slurm state and ``CODE:SIGNAL`` exit code, or None when Slurm knows no such job."""
    return _scontrol_state(job_id) or _sacct_state(job_id)


def wait_for_job(job_id: str) -> int:
    """Poll until the job reaches a final state; say each state change on stderr; return its exit code."""
    interval, last = POLL_FIRST_S, None
    while True:
        found = job_state(job_id)
        if found is None:
            raise HostError(f"job {job_id} is unknown to slurmctld and sacct", f"check it with: sacct -j {job_id}")
        state, exit_code = found
        if state != last:
            sys.stderr.write(f"distlaunch: job {job_id} is {state}\n")
            last = state
        if state in TERMINAL:
            return exit_code_of(state, exit_code)
        time.sleep(interval)
        interval = min(interval * 1.5, POLL_MAX_S)
