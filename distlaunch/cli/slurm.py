"""``distlaunch slurm run|sbatch``, and the srun-task side of ``distlaunch run`` (one rank per Slurm task)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from distlaunch.backends.registry import named
from distlaunch.cli import groups as g
from distlaunch.cli import panels as h
from distlaunch.cli.options import given_flags
from distlaunch.cli.render import print_json, print_submission
from distlaunch.slurm.lead import parse_signal_lead

if TYPE_CHECKING:
    from distlaunch.slurm.srun import SrunResult

Nodes = Annotated[
    int | None,
    typer.Option("-N", "--nodes", help="Nodes (default: the allocation's, else 1).", rich_help_panel=h.HOSTS),
]
NNodesAlias = Annotated[int | None, typer.Option("--nnodes", hidden=True)]  # run's word for -N
NtasksPerNode = Annotated[
    int | None,
    typer.Option(
        "--ntasks-per-node",
        help="Tasks = ranks per node, also spelled -n/--nproc-per-node as in run (default: the allocation's, else"
        " one per GPU, else 1).",
        rich_help_panel=h.HOSTS,
    ),
]
Ntasks = Annotated[
    int | None,
    typer.Option(
        "--ntasks",
        help="Total tasks = world size (must equal nodes × ntasks-per-node). Slurm's -n is this one; distlaunch's -n"
        " is ranks per node, as in run.",
        rich_help_panel=h.HOSTS,
    ),
]
GpusPerNode = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="GPUs per node, one per rank (default: the allocation's, else none).",
        rich_help_panel=h.HOSTS,
    ),
]
CpusPerTask = Annotated[
    int | None,
    typer.Option(
        "--cpus-per-task", help="CPU cores per rank (default: the allocation's, else Slurm's).", rich_help_panel=h.HOSTS
    ),
]
Partition = Annotated[
    str | None, typer.Option("-p", "--partition", metavar="NAME", help="Slurm partition.", rich_help_panel=h.HOSTS)
]
Account = Annotated[
    str | None, typer.Option("-A", "--account", metavar="NAME", help="Slurm account to charge.", rich_help_panel=h.RUN)
]
Time = Annotated[
    str | None, typer.Option("-t", "--time", metavar="TIME", help="Time limit, e.g. 1:00:00.", rich_help_panel=h.RUN)
]
JobName = Annotated[
    str | None,
    typer.Option(
        "-J", "--job-name", metavar="NAME", help="Job name (sbatch default: the script's name).", rich_help_panel=h.RUN
    ),
]
Requeue = Annotated[
    bool,
    typer.Option(
        "--requeue",
        help="Once every rank saved a checkpoint on the save signal, requeue this batch job (scontrol requeue "
        "$SLURM_JOB_ID), which resumes there; exit 75.",
        rich_help_panel=h.FAULTS,
    ),
]


NoRequeue = Annotated[
    bool,
    typer.Option(
        "--no-requeue",
        help="Leave out the warning ahead of the time limit and the requeue: the job ends at its time limit.",
        rich_help_panel=h.FAULTS,
    ),
]
SignalLeadOpt = Annotated[
    int | None,
    typer.Option(
        "--signal-lead",
        metavar="SECONDS",
        parser=parse_signal_lead,
        help="Send the job the save signal this many seconds before its time limit (#SBATCH"
        " --signal=B:USR1@SECONDS), so that every rank saves in time. Default: computed, for the bundled engine"
        " from its config (docs/slurm.md).",
        rich_help_panel=h.FAULTS,
        show_default=False,
    ),
]

slurm_app = typer.Typer(
    name="slurm",
    no_args_is_help=True,
    help="Run on a Slurm cluster, one rank per Slurm task: an srun wrapper and sbatch scripts.",
)
_SCRIPT_CONTEXT = {"allow_interspersed_args": False}


SLURM_OPTIONS = (
    g.Opt("nodes", Nodes, None),
    g.Opt("nnodes", NNodesAlias, None, alias_of="nodes"),
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
LAUNCH = (
    "nproc_per_node",
    "parallel",
    "master_addr",
    "master_port",
    "backend",
    "cpu_bind",
    "env",
    "python",
    "save_signal",
    "json_output",
)


@dataclass(frozen=True)
class SlurmArgs:
    """What ``slurm run|sbatch`` options say: the job's options by name (the backend builds the job from them),
    and how to report it."""

    options: dict[str, Any]
    json_output: bool


def slurm_args(values: dict[str, Any], ctx: typer.Context) -> SlurmArgs:
    """The options as typed; ``save_signal_given``: --save-signal was typed (the program saves on it)."""
    options = {k: v for k, v in values.items() if k != "json_output"}
    return SlurmArgs({**options, "save_signal_given": bool(given_flags(ctx, ("save_signal",)))}, values["json_output"])


def slurm_options(*launch: str, json_help: str) -> Callable[[Callable], Callable]:
    """The program, the Slurm options and these launch options, handed to the command as ``launch: SlurmArgs``;
    ``json_help`` says what this command's --json prints."""
    # -n/--nproc-per-node is Slurm's --ntasks-per-node: taken, and shown under Slurm's own word
    shared = g.hidden(g.retold(g.pick(g.LAUNCH_OPTIONS, *LAUNCH, *launch), json_output=json_help), "nproc_per_node")
    return g.with_options(g.PROGRAM, SLURM_OPTIONS, shared, build=slurm_args)


@slurm_app.command("run", context_settings=_SCRIPT_CONTEXT)
@slurm_options(
    "grace_period",
    json_help="Machine-readable output: the srun job with --dry-run (its srun command and every rank's command),"
    " else how the step ended (rank output goes to stderr).",
)
def slurm_run(
    launch: SlurmArgs,
    requeue: Requeue = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the srun command and start nothing.", rich_help_panel=h.RUN)
    ] = False,
) -> int:
    """Run SCRIPT with srun, one task per rank, inside this allocation or asking for one.

    One failing rank stops the step (srun --kill-on-bad-exit=1). Ctrl-C or SIGTERM sends every rank SIGTERM, waits
    the --grace-period, then sends SIGKILL (a second Ctrl-C: SIGKILL at once). The save signal (--save-signal, USR1)
    is passed on to every rank, which saves a checkpoint and stops; a SIGTERM passes it on first to ranks that save
    on it.

    Exit code: the first failing rank's (128+N if killed by signal N), 2 for bad options, 75 when every rank saved as
    asked (--requeue: and the job was requeued), 130/143 after Ctrl-C / SIGTERM.
    """
    slurm, options, json_output = named("slurm"), {**launch.options, "requeue": requeue}, launch.json_output
    if dry_run:
        job = slurm.srun_job(options)
        print_json(job) if json_output else print(shlex.join(job.srun))
        return 0
    result = slurm.srun(options, out=sys.stderr if json_output else None)  # --json: stdout is the report only
    _report(result)
    if json_output:
        print_json(result)
    return result.exit_code


def _requeue_words(result: SrunResult) -> str:
    """What became of the saved job: ``requeued Slurm job 12: it resumes there``, or how to resume it."""
    job = os.environ.get("SLURM_JOB_ID")
    if result.requeued:
        return f"requeued Slurm job {job}: it resumes there"
    if result.requeue_error:
        again = f"scontrol requeue {job}" if job else "submit it again"
        return f"not requeued: {result.requeue_error} ({again} and it resumes there)"
    return "requeue the job (or start it again) and it resumes there"


def _report(result: SrunResult) -> None:
    failure = result.failure
    if result.interrupted:
        saved = ""
        if result.saved:
            saved = f"; rank {result.saved_by_rank} saved the checkpoint of step {result.saved_step}"
            saved += f"; {_requeue_words(result)}" if result.requeued or result.requeue_error else ""
        sys.stderr.write(
            f"distlaunch: interrupted by {result.interrupted}; {result.stopped or 'srun had already ended'}{saved} "
            f"(exit {result.exit_code})\n"
        )
    elif result.save_asked_by:
        then = _requeue_words(result) if result.saved else _ended_words(result)
        sys.stderr.write(
            f"distlaunch: {result.save_asked_by} (the save signal); {result.save_sent}; {then} "
            f"(exit {result.exit_code})\n"
        )
    elif failure:
        how = f"was killed by {failure.signal}" if failure.signal else f"exited with code {failure.exit_code}"
        how += " (out of memory)" if failure.out_of_memory else ""
        sys.stderr.write(
            f"distlaunch: rank {failure.rank} on {failure.node} {how}; srun stopped the other ranks "
            f"(exit {result.exit_code})\n"
        )


def _ended_words(result: SrunResult) -> str:
    """How the ranks ended when they did not all save and exit 0."""
    failure = result.failure
    if failure:
        how = f"was killed by {failure.signal}" if failure.signal else f"exited with code {failure.exit_code}"
        return f"rank {failure.rank} on {failure.node} {how}"
    return f"srun exited {result.srun_exit_code}" if result.srun_exit_code else "every rank exited 0"


@slurm_app.command("sbatch", context_settings=_SCRIPT_CONTEXT)
@slurm_options(
    "grace_period",
    json_help="Machine-readable output: with --dry-run the job, its batch script and the signal lead; else the"
    " submitted job's id and output file (with --wait: its exit code; the job's output goes to stderr).",
)
def slurm_sbatch(
    launch: SlurmArgs,
    no_requeue: NoRequeue = False,
    signal_lead: SignalLeadOpt = None,
    output: Annotated[
        str | None,
        typer.Option(
            "-o",
            "--output",
            metavar="FILE",
            help="Job output file (sbatch patterns such as %j; default slurm-%j.out).",
            rich_help_panel=h.OUTPUT,
        ),
    ] = None,
    template: Annotated[
        Path | None,
        typer.Option(
            "--template",
            metavar="FILE",
            help="Your own copy of the sbatch template (default: the one shipped with distlaunch).",
            rich_help_panel=h.RUN,
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the job's output until it ends; exit with the job's exit code.",
            rich_help_panel=h.RUN,
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the batch script and submit nothing.", rich_help_panel=h.RUN)
    ] = False,
) -> int:
    """Write a batch script from the sbatch template, submit it, and print the job id (--wait: follow it to the end).

    By default the job outlives its time limit: Slurm sends it the save signal LEAD seconds ahead (--signal-lead;
    computed), every rank saves a checkpoint, and the job requeues itself and resumes there (--no-requeue: it just
    ends)."""
    slurm = named("slurm")
    asked = {"no_requeue": no_requeue, "signal_lead": signal_lead, "output": output, "template": template, "wait": wait}
    submission = slurm.submission({**launch.options, **asked})
    if dry_run:
        print_submission(submission, launch.json_output)
        return 0
    result = slurm.submit(submission, sys.stderr if launch.json_output else sys.stdout, g.command_line())
    if wait:
        sys.stderr.write(f"distlaunch: job {result.job_id} ended with exit code {result.exit_code}\n")
    if launch.json_output:
        print_json(result)
    return result.exit_code or 0
