"""``distlaunch slurm run|sbatch``, and the srun-task side of ``distlaunch run`` (one rank per Slurm task)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from distlaunch.backends.slurm_batch import SlurmBatch
from distlaunch.cli import groups as g
from distlaunch.cli.render import print_json
from distlaunch.contract.env import parse_env
from distlaunch.protocol import GRACE_PERIOD_S
from distlaunch.slurm.job import SlurmJobOptions, resolve_job
from distlaunch.slurm.srun import SrunResult, run_srun

SLURM = "Slurm options"

Nodes = Annotated[
    int | None,
    typer.Option("-N", "--nodes", help="Nodes (default: the allocation's, else 1).", rich_help_panel=SLURM),
]
NtasksPerNode = Annotated[
    int | None,
    typer.Option(
        "--ntasks-per-node",
        help="Tasks = ranks per node (same as -n; default: the allocation's, else one per GPU, else 1).",
        rich_help_panel=SLURM,
    ),
]
Ntasks = Annotated[
    int | None,
    typer.Option(
        "--ntasks", help="Total tasks = world size (must equal nodes × ntasks-per-node).", rich_help_panel=SLURM
    ),
]
GpusPerNode = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="GPUs per node, one per rank (default: the allocation's, else none).",
        rich_help_panel=SLURM,
    ),
]
CpusPerTask = Annotated[
    int | None,
    typer.Option(
        "--cpus-per-task", help="CPU cores per rank (default: the allocation's, else Slurm's).", rich_help_panel=SLURM
    ),
]
Partition = Annotated[str | None, typer.Option("-p", "--partition", help="Slurm partition.", rich_help_panel=SLURM)]
Account = Annotated[str | None, typer.Option("-A", "--account", help="Slurm account to charge.", rich_help_panel=SLURM)]
Time = Annotated[str | None, typer.Option("-t", "--time", help="Time limit, e.g. 1:00:00.", rich_help_panel=SLURM)]
JobName = Annotated[
    str | None,
    typer.Option("-J", "--job-name", help="Job name (sbatch default: the script's name).", rich_help_panel=SLURM),
]

slurm_app = typer.Typer(
    name="slurm",
    no_args_is_help=True,
    help="Run on a Slurm cluster, one rank per Slurm task: an srun wrapper and sbatch scripts.",
)
_SCRIPT_CONTEXT = {"allow_interspersed_args": False}


SLURM_OPTIONS = (
    g.Opt("nodes", Nodes, None),
    g.Opt("ntasks_per_node", NtasksPerNode, None),
    g.Opt("ntasks", Ntasks, None),
    g.Opt("gpus_per_node", GpusPerNode, None),
    g.Opt("cpus_per_task", CpusPerTask, None),
    g.Opt("partition", Partition, None),
    g.Opt("account", Account, None),
    g.Opt("time", Time, None),
    g.Opt("job_name", JobName, None),
)
# what a task's ``distlaunch run --launcher slurm`` gets (job.forwarded_options), and how this command reports
LAUNCH = ("nproc_per_node", "parallel", "master_addr", "master_port", "backend", "env", "python", "json_output")


@dataclass(frozen=True)
class SlurmArgs:
    """What ``slurm run|sbatch`` options say: the job, and how to run and report it."""

    opts: SlurmJobOptions
    json_output: bool
    grace_period: float  # slurm run: SIGTERM to SIGKILL


def slurm_args(values: dict[str, Any], ctx: typer.Context) -> SlurmArgs:
    """The job options as typed (--python unset or empty: the launcher's own), built here only."""
    opts = SlurmJobOptions(**g.fields_of(SlurmJobOptions, {**values, "python": values["python"] or None}))
    return SlurmArgs(opts, values["json_output"], values.get("grace_period", GRACE_PERIOD_S))


def slurm_options(*launch: str) -> Callable[[Callable], Callable]:
    """The program, the Slurm options and these launch options, handed to the command as ``launch: SlurmArgs``."""
    return g.with_options(g.PROGRAM, SLURM_OPTIONS, g.pick(g.LAUNCH_OPTIONS, *LAUNCH, *launch), build=slurm_args)


@slurm_app.command("run", context_settings=_SCRIPT_CONTEXT)
@slurm_options("grace_period")
def slurm_run(
    launch: SlurmArgs,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the srun command and start nothing.")] = False,
) -> int:
    """Run SCRIPT with srun, one task per rank, inside this allocation or asking for one.

    One failing rank stops the step (--kill-on-bad-exit=1). Ctrl-C or SIGTERM sends every rank SIGTERM, waits
    --grace-period, then SIGKILL (a second Ctrl-C: SIGKILL at once). Exit code: the first failing rank's (128+N if
    killed by signal N), 2 for bad options, 130/143 after Ctrl-C / SIGTERM.
    """
    opts, json_output = launch.opts, launch.json_output
    job = resolve_job(opts, os.environ)
    if dry_run:
        print_json(job) if json_output else print(shlex.join(job.srun))
        return 0
    # --json: stdout is the report only; --env values go through srun's environment, never its argv
    result = run_srun(
        job.srun, out=sys.stderr if json_output else None, env=parse_env(opts.env), grace_period=launch.grace_period
    )
    _report(result)
    if json_output:
        print_json(result)
    return result.exit_code


def _report(result: SrunResult) -> None:
    failure = result.failure
    if result.interrupted:
        sys.stderr.write(
            f"distlaunch: interrupted by {result.interrupted}; {result.stopped or 'srun had already ended'} "
            f"(exit {result.exit_code})\n"
        )
    elif failure:
        how = f"was killed by {failure.signal}" if failure.signal else f"exited with code {failure.exit_code}"
        how += " (out of memory)" if failure.out_of_memory else ""
        sys.stderr.write(
            f"distlaunch: rank {failure.rank} on {failure.node} {how}; srun stopped the other ranks "
            f"(exit {result.exit_code})\n"
        )


@slurm_app.command("sbatch", context_settings=_SCRIPT_CONTEXT)
@slurm_options()
def slurm_sbatch(
    launch: SlurmArgs,
    output: Annotated[
        str | None,
        typer.Option(
            "-o",
            "--output",
            help="Job output file (sbatch patterns such as %j; default slurm-%j.out).",
            rich_help_panel=SLURM,
        ),
    ] = None,
    template: Annotated[
        Path | None,
        typer.Option(
            "--template", help="Your own copy of the sbatch template (default: the one shipped with distlaunch)."
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the job's output until it ends; exit with the job's exit code.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batch script and submit nothing.")] = False,
) -> int:
    """Write a batch script from the sbatch template, submit it, and print the job id (--wait: follow it to the end)."""
    opts, json_output = launch.opts, launch.json_output
    batch = SlurmBatch()
    if dry_run:
        job, script = batch.script(opts, output, template)
        if json_output:
            print(json.dumps({"job": job.model_dump(mode="json"), "script": script}, indent=2))
        else:
            sys.stdout.write(script)
        return 0
    out = sys.stderr if json_output else sys.stdout
    result = batch.submit(opts, output, template, wait, out, g.command_line())
    if wait:
        sys.stderr.write(f"distlaunch: job {result.job_id} ended with exit code {result.exit_code}\n")
    if json_output:
        print_json(result)
    return result.exit_code or 0
