"""Render the sbatch template, submit it, and follow the job to its end.

The template is a plain bash script with ``{{name}}`` placeholders (not ``$name``, which is bash's own syntax).
A line whose placeholders all render empty is left out, so optional ``#SBATCH`` lines vanish when not asked for.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import shlex
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel

from distlaunch.contract.env import parse_env
from distlaunch.errors import HostError, UsageError
from distlaunch.files import os_error_words, read_settings
from distlaunch.slurm.job import SlurmJob, SlurmJobOptions, export_option, wrapper_options
from distlaunch.slurm.jobstate import wait_for_job
from distlaunch.slurm.lead import SignalLead, check_time_limit, engine_estimate, signal_lead

log = logging.getLogger("distlaunch")

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}( ?)")
DEFAULT_OUTPUT = "slurm-%j.out"  # sbatch's own default, in the submit directory
SBATCH_TIMEOUT_S = 60.0  # submitting: longer than a query (SLURM_CMD_TIMEOUT_S), sbatch retries a busy slurmctld
_DIRECTIVE_SPECIAL = re.compile(r"[\s\"'\\#]")  # what sbatch's #SBATCH parser splits, unquotes or cuts at


def packaged_template() -> str:
    """The sbatch template shipped inside the package (templates/sbatch.sh in the repository links to it)."""
    return resources.files("distlaunch").joinpath("templates/sbatch.sh").read_text(encoding="utf-8")


def render(template: str, values: dict[str, str], name: str = "sbatch template") -> str:
    """Fill ``{{name}}`` placeholders; drop lines whose placeholders are all empty; unknown names are an error."""
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(values))
    if unknown:
        raise UsageError(
            f"{name} uses {'an unknown placeholder' if len(unknown) == 1 else 'unknown placeholders'} {', '.join('{{' + u + '}}' for u in unknown)}",
            f"known placeholders: {', '.join(sorted(values))}",
        )
    lines = []
    for line in template.splitlines(keepends=True):
        names = [m.group(1) for m in _PLACEHOLDER.finditer(line)]
        if names and not any(values[n] for n in names):
            continue
        lines.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)] + m.group(2) if values[m.group(1)] else "", line))
    return "".join(lines)


def default_job_name(opts: SlurmJobOptions) -> str:
    """The script's stem (train.py → train), or the module's last part."""
    first = opts.program[0]
    return first.rsplit(".", 1)[-1] if opts.module else Path(first).stem or "distlaunch"


def _optional(value: object) -> str:
    """An optional #SBATCH value: empty (so the line is left out) when not given."""
    return "" if value in (None, 0, "") else str(value)


def directive_value(flag: str, value: str, default: bool = False) -> str:
    """A value for an ``#SBATCH --opt=VALUE`` line, as sbatch's directive parser reads it back.

    That parser splits at whitespace, takes '...' and "..." as quotes, a backslash as an escape, and an
    unquoted # as the start of a comment: such a value is double-quoted, with " and \\ escaped. A control
    character (a newline above all, which would end the directive and start a script line) is refused.
    ``default``: the value is distlaunch's default for ``flag`` (the job name from the script's name)."""
    bad = next((c for c in value if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        what = f"the default {flag} {value!r} (the script's name)" if default else f"{flag} {value!r}"
        raise UsageError(
            f"{what} holds a control character ({bad!r}): an #SBATCH line is one line of the script",
            f"give {flag} on one line, without control characters",
        )
    if not _DIRECTIVE_SPECIAL.search(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def requeue_values(lead: SignalLead | None) -> dict[str, str]:
    """The lines that make a job outlive its time limit, or none (``--no-requeue``): Slurm warns the batch shell
    LEAD seconds ahead, ``distlaunch slurm run`` has every rank save and requeues the job, and the requeued job
    appends to the same output file."""
    if lead is None:
        return {"requeue_note": "", "lead_how": "", "signal": "", "requeue": "", "open_mode": ""}
    note = (
        f"Slurm sends SIG{lead.signal} to distlaunch slurm run LEAD seconds before the time limit: every rank saves "
        "a checkpoint, then the job requeues itself (exit 75) and resumes there"
    )
    values = {"requeue_note": note, "lead_how": lead.how, "signal": lead.directive, "requeue": "--requeue"}
    return {**values, "open_mode": "append"}


def batch_lead(job: SlurmJob, opts: SlurmJobOptions) -> SignalLead | None:
    """How far ahead of its time limit the job is warned; None when it is not to be requeued (``--no-requeue``,
    ``--save-signal none``). Refused when the warning would come at the start of every run."""
    if not opts.requeue or opts.save_signal is None:
        return None
    estimate = None
    if opts.signal_lead is None:
        estimate = engine_estimate(opts, opts.parallel, job.world_size, job.ntasks_per_node, job.gpus_per_node > 0)
    lead = signal_lead(opts.save_signal, opts.signal_lead, estimate)
    check_time_limit(lead, job.time)
    return lead


def script_values(
    job: SlurmJob, opts: SlurmJobOptions, output: str | None, lead: SignalLead | None = None
) -> dict[str, str]:
    """The placeholder values of one job (the #SBATCH ones checked and quoted for sbatch's parser)."""
    return {
        "job_name": directive_value("-J/--job-name", job.job_name or default_job_name(opts), not job.job_name),
        "nodes": str(job.nodes),
        "ntasks_per_node": str(job.ntasks_per_node),
        "gpus_per_node": _optional(job.gpus_per_node),
        "cpus_per_task": _optional(job.cpus_per_task),
        "time": directive_value("-t/--time", _optional(job.time)),
        "partition": directive_value("-p/--partition", _optional(job.partition)),
        "account": directive_value("-A/--account", _optional(job.account)),
        "output": directive_value("-o/--output", _optional(output)),
        "export": _optional(export_option(list(parse_env(opts.env)), None)),
        "distlaunch": f"{shlex.quote(opts.python)} -m distlaunch",
        "launch_options": shlex.join(wrapper_options(opts)),
        "program": shlex.join(opts.program),
        **requeue_values(lead),
    }


def render_script(
    job: SlurmJob,
    opts: SlurmJobOptions,
    output: str | None,
    template: Path | None = None,
    lead: SignalLead | None = None,
) -> str:
    """The batch script for a job, from the packaged template or the user's own copy."""
    values = script_values(job, opts, output, lead)
    if template is None:
        return render(packaged_template(), values)
    try:
        text = read_settings(template)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot read --template {template}: {os_error_words(exc)}", "give the path of your sbatch template"
        ) from None
    return render(text, values, name=f"template {template}")


class SbatchResult(BaseModel):
    """A submitted job; ``exit_code`` is set when distlaunch waited for it."""

    job_id: str
    output: str | None  # the job's output file, with %j / %x / %u filled in where possible
    exit_code: int | None = None


def output_path(pattern: str | None, job_id: str, job_name: str) -> str | None:
    """The job's output file; None when the pattern uses per-node or per-task fields distlaunch cannot fill in."""
    text = pattern or DEFAULT_OUTPUT
    fills = {"j": job_id, "A": job_id, "x": job_name, "u": getpass.getuser(), "%": "%"}
    unknown = [c for c in re.findall(r"%(.)", text) if c not in fills]
    return None if unknown else re.sub(r"%(.)", lambda m: fills[m.group(1)], text)


class _Follower(threading.Thread):
    """Copies new lines of a growing file to ``out`` until stopped (``tail -f`` for the job's output)."""

    def __init__(self, path: Path, out: TextIO):
        super().__init__(daemon=True)
        self.path, self.out, self.stop, self.pos, self.partial = path, out, threading.Event(), 0, ""

    def run(self):
        """Poll the file until stopped, then read what is left."""
        while not self.stop.wait(0.2):
            self.read()
        self.read()
        if self.partial:
            self.out.write(self.partial + "\n")

    def read(self):
        """Copy the complete lines added since the last read."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except OSError:
            return
        *lines, self.partial = (self.partial + data).split("\n")
        for line in lines:
            self.out.write(line + "\n")
        self.out.flush()


def make_output_dir(output: str | None, job_name: str) -> None:
    """Create the output file's folder: Slurm does not, and the job then fails without a word of output
    (Slurm reports only "JobLaunchFailure"). A folder named with a field known before the job exists (%x,
    %u) is filled in; one with a field that only the job has (%j, a node's or a task's) cannot be created
    here, and is refused."""
    if not output:
        return
    parent = str(Path(output).parent)
    folder_text = output_path(parent, job_id="", job_name=job_name) if "%" in parent else parent
    if folder_text is None or re.search(r"%[jA]", parent.replace("%%", "")):
        raise UsageError(
            f"-o/--output {output}: its folder {parent} has a field only the job knows, and Slurm creates no "
            "folder, so the job would fail to start",
            "put the job's fields in the file name (e.g. logs/train-%j.out); the folder may use %x and %u",
        )
    folder = Path(folder_text)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, /proc, no permission, a read-only file system
        file = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = f"{file} is a file, not a folder" if file is not None else exc.strerror or str(exc)
        raise UsageError(
            f"cannot create the folder {folder} of -o/--output {output}: {why}",
            "give an --output in a folder you can write (distlaunch creates missing folders)",
        ) from None


def submit(
    script: str,
    *,
    wait: bool,
    job_name: str,
    output: str | None,
    out: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    on_submitted: Callable[[SbatchResult], None] | None = None,
) -> SbatchResult:
    """Submit with ``sbatch --parsable`` (script on stdin); with ``wait``, follow the job's output until it ends.

    ``env`` (the --env values) is added to sbatch's environment, which the job exports: never to the script.
    ``on_submitted`` hears of the job as soon as Slurm has accepted it.
    """
    out = out or sys.stdout
    make_output_dir(output, job_name)
    try:
        done = subprocess.run(
            ["sbatch", "--parsable"],
            input=script,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=SBATCH_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise HostError(
            "'sbatch' not found: Slurm's client commands are not installed here",
            "run on a Slurm login node, or install slurm-client",
        ) from None
    except subprocess.TimeoutExpired:
        raise HostError(
            f"sbatch did not answer within {SBATCH_TIMEOUT_S:g}s: the job may or may not have been submitted",
            "look for it with 'squeue --me'; check slurmctld with 'scontrol ping'",
        ) from None
    job_id = done.stdout.strip().split(";")[0]  # --parsable: "JOBID" or "JOBID;CLUSTER"
    if done.returncode or not job_id:
        err = done.stderr.strip().splitlines()
        raise HostError(
            f"sbatch refused the job: {err[-1] if err else f'exit code {done.returncode}'}",
            "check --partition, --account, --time and the node/GPU counts against sinfo",
        )
    result = SbatchResult(job_id=job_id, output=output_path(output, job_id, job_name))
    out.write(f"submitted batch job {job_id}\n")
    out.flush()
    if on_submitted is not None:
        on_submitted(result)
    if not wait:
        return result
    follower = _Follower(Path(result.output), out) if result.output else None
    if follower:
        follower.start()
    try:
        code = wait_for_job(job_id)
    except KeyboardInterrupt:
        log.warning(f"stopped following; job {job_id} keeps running (scancel {job_id} stops it)")
        raise
    finally:
        if follower:
            follower.stop.set()
            follower.join()
    return result.model_copy(update={"exit_code": code})
