"""A batch job's state through ``scontrol show job`` (``sacct`` once slurmctld has forgotten it); ``--wait``.

Three answers are kept apart: the job's state; "Slurm knows no such job" (slurmctld says *Invalid job id*
and sacct has no row: the job is gone); and "Slurm could not be asked" (slurmctld down or unreachable, a
missing slurm.conf, a command that timed out: ``SlurmUnanswered``), after which the job's state is unknown,
not gone.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from typing import NamedTuple

from distlaunch.errors import HostError

log = logging.getLogger("distlaunch")

# Every Slurm query and scancel: longer than Slurm's own retries at its default MessageTimeout of 10 s (scancel
# gives up on an unreachable slurmctld after ~9 s, scontrol show job after ~18 s) so that its own message
# comes back, and still bounded. 'jobs' stays quick without waiting on it: an instant 'scontrol ping' comes
# first, and a listing asks an unreachable slurmctld once, not once per job (backends/recorded.py).
SLURM_CMD_TIMEOUT_S = 20.0
POLL_FIRST_S, POLL_MAX_S = 0.5, 5.0  # quick for short jobs, gentle on slurmctld for long ones
UNANSWERED_WAIT_S = 600.0  # --wait: how long slurmctld may stay out of reach before distlaunch gives up on it
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
INVALID_JOB = "Invalid job id specified"  # scontrol's answer for a job slurmctld does not (or no longer) know
NO_ACCOUNTING = "accounting storage is disabled"  # sacct where the site keeps no accounting


class SlurmUnanswered(HostError):
    """Slurm could not be asked about a job (slurmctld unreachable, no slurm.conf, a command timed out): the
    job's state is unknown, not gone."""


class SlurmJobState(NamedTuple):
    """What Slurm says about one batch job."""

    state: str  # PENDING, RUNNING, COMPLETED, ...
    exit_code: str  # Slurm's CODE:SIGNAL
    nodes: int | None = None  # how many nodes it has (or asks for, while pending)
    node_list: str | None = None  # its nodes as a Slurm hostlist (node[1-2]); None before it has any
    restarts: int | None = None  # how often Slurm requeued it (scontrol's Restarts=; sacct does not say)


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
    if not value and state.startswith("CANCELLED"):  # cancelled before any task ran (still pending): stopped
        return 128 + signal.SIGTERM
    return value if value or state == "COMPLETED" else 1


def said(done: subprocess.CompletedProcess | subprocess.TimeoutExpired) -> str:
    """A Slurm command's complaint in one line: its fatal line, else its first line on stderr (else stdout)."""

    def text(value: str | bytes | None) -> list[str]:
        value = value.decode(errors="replace") if isinstance(value, bytes) else value or ""
        return [line.strip() for line in value.splitlines() if line.strip()]

    err, out = text(done.stderr), text(done.stdout)
    fatal = [line for line in err if "fatal:" in line]
    return (fatal or err or out or [""])[0]


def slurm_command(argv: list[str]) -> subprocess.CompletedProcess:
    """Run a Slurm client command (bounded by SLURM_CMD_TIMEOUT_S); a timeout is ``SlurmUnanswered``.

    A ``SLURM_CONF`` that names no file is refused at once: Slurm's commands would wait 60 s for it to appear.
    FileNotFoundError (no such command here) is left to the caller."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        raise SlurmUnanswered(
            f"cannot reach slurmctld: SLURM_CONF={conf} does not exist",
            "point SLURM_CONF at the cluster's slurm.conf, or unset it",
        )
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_CMD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        complaint = said(exc)
        raise SlurmUnanswered(
            f"cannot reach slurmctld: '{' '.join(argv)}' did not answer within {SLURM_CMD_TIMEOUT_S:g}s"
            + (f" ({complaint})" if complaint else ""),
            "check slurmctld with 'scontrol ping'",
        ) from None


def check_controller() -> None:
    """``scontrol ping``: instant when slurmctld is down (``scontrol show job`` retries for ~18 s first)."""
    done = slurm_command(["scontrol", "ping"])
    if done.returncode and " is UP" not in done.stdout:
        raise SlurmUnanswered(
            f"cannot reach slurmctld: {said(done) or f'scontrol ping exited {done.returncode}'}",
            "check slurmctld with 'scontrol ping' (and SLURM_CONF)",
        )


def _scontrol_state(job_id: str) -> SlurmJobState | None:
    done = slurm_command(["scontrol", "show", "job", "-o", job_id])
    if done.returncode:
        if INVALID_JOB in done.stderr:
            return None  # not (or no longer) known to slurmctld: sacct may still know how it ended
        raise SlurmUnanswered(
            f"cannot reach slurmctld: {said(done) or f'scontrol show job exited {done.returncode}'}",
            "check slurmctld with 'scontrol ping'",
        )
    fields = job_fields(done.stdout)
    if "JobState" not in fields:
        return None
    nodes = re.match(r"\d+", fields.get("NumNodes", ""))
    node_list = fields.get("NodeList", "")
    restarts = fields.get("Restarts", "")
    return SlurmJobState(
        fields["JobState"],
        fields.get("ExitCode", "0:0"),
        int(nodes.group()) if nodes else None,
        node_list if node_list and node_list != "(null)" else None,
        int(restarts) if restarts.isdigit() else None,
    )


def _sacct_state(job_id: str) -> SlurmJobState | None:
    try:
        done = slurm_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NNodes,NodeList"])
    except FileNotFoundError:
        return None
    if done.returncode:
        if NO_ACCOUNTING in done.stderr:
            return None  # no accounting at this site: nothing knows the job any more
        raise SlurmUnanswered(
            f"slurmctld no longer knows job {job_id}, and sacct failed: {said(done) or f'exit {done.returncode}'}",
            f"check it with: sacct -j {job_id}",
        )
    lines = done.stdout.strip().splitlines()
    if not lines or "|" not in lines[0]:
        return None
    state, exit_code, nodes, node_list = [*lines[0].split("|"), "", ""][:4]
    return SlurmJobState(
        state.split()[0],  # "CANCELLED by 0" → CANCELLED
        exit_code,
        int(nodes) if nodes.isdigit() else None,
        node_list if node_list and node_list not in ("None assigned", "(null)") else None,
    )


def job_state(job_id: str) -> SlurmJobState | None:
    """A batch job's Slurm state, or None when Slurm knows no such job.

    Raises ``SlurmUnanswered`` when Slurm cannot be asked (the job's state is then unknown), FileNotFoundError
    when Slurm's commands are not installed here."""
    check_controller()
    return _scontrol_state(job_id) or _sacct_state(job_id)


def wait_for_job(job_id: str) -> int:
    """Poll until the job reaches a final state; tell each state change (the distlaunch logger); return its exit code.

    slurmctld out of reach (a restart, a failover) is waited out for up to UNANSWERED_WAIT_S, said once on
    stderr when it starts and once when slurmctld answers again."""
    interval, last, unanswered_since, restarts = POLL_FIRST_S, None, None, None
    while True:
        try:
            found = job_state(job_id)
        except SlurmUnanswered as exc:
            now = time.monotonic()
            if unanswered_since is None:
                unanswered_since = now
                log.warning(f"{exc.message}; job {job_id} may still run: asking again for up to {UNANSWERED_WAIT_S:g}s")
            elif now - unanswered_since >= UNANSWERED_WAIT_S:
                raise SlurmUnanswered(
                    f"gave up following job {job_id}: {exc.message} (for {now - unanswered_since:.0f}s)",
                    f"the job may still run: see 'distlaunch status slurm-{job_id}' once slurmctld answers "
                    f"(scancel {job_id} stops it)",
                ) from None
            time.sleep(interval)
            interval = min(interval * 1.5, POLL_MAX_S)
            continue
        if unanswered_since is not None:
            log.warning(f"slurmctld answers again about job {job_id}")
            unanswered_since = None
        if found is None:
            raise HostError(f"job {job_id} is unknown to slurmctld and sacct", f"check it with: sacct -j {job_id}")
        if restarts is not None and found.restarts is not None and found.restarts > restarts:
            log.info(f"job {job_id} was requeued (restart {found.restarts})")
        restarts = found.restarts if found.restarts is not None else restarts
        if found.state != last:
            log.info(f"job {job_id} is {found.state}")
            last = found.state
        if found.state in TERMINAL:
            return exit_code_of(found.state, found.exit_code)
        time.sleep(interval)
        interval = min(interval * 1.5, POLL_MAX_S)
