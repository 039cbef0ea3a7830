"""``distlaunch slurm run|sbatch``, and the srun-task side of ``distlaunch run`` (one rank per Slurm task)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from distlaunch.backends.slurm_batch import SlurmBatch
from distlaunch.cli import options as o
from distlaunch.cli.render import print_json
from distlaunch.contract.env import parse_env
from distlaunch.slurm.job import SlurmJobOptions, resolve_job
from distlaunch.slurm.srun import SrunResult, run_srun

SLURM = "Slurm options"

Program = Annotated[
    list[str],
    typer.Argument(
        help="SCRIPT [ARGS]... (or MODULE [ARGS]... with -m). Everything after SCRIPT goes to the script.",
        show_default=False,
    ),
]
Module = Annotated[bool, typer.Option("-m", "--module", help="Run PROGRAM as a module, like python -m.")]
NoPython = Annotated[bool, typer.Option("--no-python", help="Run PROGRAM as an executable, not through Python.")]
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


def _job_options(program, module, no_python, python, **shape) -> SlurmJobOptions:
    return SlurmJobOptions(
        program=program,
        module=module,
        no_python=no_python,
        env=shape.pop("env") or [],
        **({"python": python} if python else {}),
        **shape,
    )


@slurm_app.command("run", context_settings=_SCRIPT_CONTEXT)
def slurm_run(
    program: Program,
    module: Module = False,
    no_python: NoPython = False,
    nodes: Nodes = None,
    ntasks_per_node: NtasksPerNode = None,
    nproc_per_node: o.NprocPerNode = None,
    ntasks: Ntasks = None,
    gpus_per_node: GpusPerNode = None,
    cpus_per_task: CpusPerTask = None,
    partition: Partition = None,
    account: Account = None,
    time: Time = None,
    job_name: JobName = None,
    parallel: o.ParallelOpt = None,
    master_addr: o.MasterAddr = None,
    master_port: o.MasterPort = "auto",
    backend: o.Backend = "auto",
    env: o.Env = None,
    python: o.Python = None,
    grace_period: o.GracePeriod = 10.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the srun command and start nothing.")] = False,
    json_output: o.Json = False,
) -> int:
    """Run SCRIPT with srun, one task per rank, inside this allocation or asking for one.

    One failing rank stops the step (--kill-on-bad-exit=1). Ctrl-C or SIGTERM sends every rank SIGTERM, waits
    --grace-period, then SIGKILL (a second Ctrl-C: SIGKILL at once). Exit code: the first failing rank's (128+N if
    killed by signal N), 2 for bad options, 130/143 after Ctrl-C / SIGTERM.
    """
    opts = _job_options(
        program,
        module,
        no_python,
        python,
        nodes=nodes,
        ntasks_per_node=ntasks_per_node,
        nproc_per_node=nproc_per_node,
        ntasks=ntasks,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        partition=partition,
        account=account,
        time=time,
        job_name=job_name,
        parallel=parallel,
        master_addr=master_addr,
        master_port=master_port,
        backend=backend,
        env=env,
    )
    job = resolve_job(opts, os.environ)
    if dry_run:
        print_json(job) if json_output else print(shlex.join(job.srun))
        return 0
    # --json: stdout is the report only; --env values go through srun's environment, never its argv
    result = run_srun(
        job.srun, out=sys.stderr if json_output else None, env=parse_env(opts.env), grace_period=grace_period
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
def slurm_sbatch(
    program: Program,
    module: Module = False,
    no_python: NoPython = False,
    nodes: Nodes = None,
    ntasks_per_node: NtasksPerNode = None,
    nproc_per_node: o.NprocPerNode = None,
    ntasks: Ntasks = None,
    gpus_per_node: GpusPerNode = None,
    cpus_per_task: CpusPerTask = None,
    partition: Partition = None,
    account: Account = None,
    time: Time = None,
    job_name: JobName = None,
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
    parallel: o.ParallelOpt = None,
    master_addr: o.MasterAddr = None,
    master_port: o.MasterPort = "auto",
    backend: o.Backend = "auto",
    env: o.Env = None,
    python: o.Python = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batch script and submit nothing.")] = False,
    json_output: o.Json = False,
) -> int:
    """Write a batch script from the sbatch template, submit it, and print the job id (--wait: follow it to the end)."""
    opts = _job_options(
        program,
        module,
        no_python,
        python,
        nodes=nodes,
        ntasks_per_node=ntasks_per_node,
        nproc_per_node=nproc_per_node,
        ntasks=ntasks,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        partition=partition,
        account=account,
        time=time,
        job_name=job_name,
        parallel=parallel,
        master_addr=master_addr,
        master_port=master_port,
        backend=backend,
        env=env,
    )
    batch = SlurmBatch()
    if dry_run:
        job, script = batch.script(opts, output, template)
        if json_output:
            print(json.dumps({"job": job.model_dump(mode="json"), "script": script}, indent=2))
        else:
            sys.stdout.write(script)
        return 0
    out = sys.stderr if json_output else sys.stdout
    result = batch.submit(opts, output, template, wait, out, ["distlaunch", *sys.argv[1:]])
    if wait:
        sys.stderr.write(f"distlaunch: job {result.job_id} ended with exit code {result.exit_code}\n")
    if json_output:
        print_json(result)
    return result.exit_code or 0
