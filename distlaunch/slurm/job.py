"""``distlaunch slurm run`` / ``sbatch``: options → a checked ``SlurmJob`` with the srun command that runs it.

One Slurm task per rank: srun starts nodes × ntasks-per-node tasks, each runs ``distlaunch run --launcher slurm``
which maps its SLURM_* variables to the rank environment and execs the script.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from distlaunch.contract.endpoint import parse_port
from distlaunch.contract.env import parse_env
from distlaunch.contract.layout import Layout, layout_spec, resolve_layout, tp_group_across_nodes
from distlaunch.contract.options import DEFAULT_SAVE_SIGNAL, LaunchOptions, ProgramOptions, SharedOptions
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.program import build_command, check_script
from distlaunch.placement import check_sets
from distlaunch.protocol import GRACE_PERIOD_S
from distlaunch.readable import plural
from distlaunch.slurm.lead import is_engine

SAVE_SIGNAL_VAR = "DISTLAUNCH_SAVE_SIGNAL"  # every rank's: the signal it saves a checkpoint on (then it stops)
# every rank's: the signal it saves a checkpoint on and trains on (distlaunch checkpoint slurm-N)
CHECKPOINT_SIGNAL_VAR = "DISTLAUNCH_CHECKPOINT_SIGNAL"


def checkpoint_signal(save_signal: str | None) -> str | None:
    """The signal for a checkpoint on demand beside the save signal: USR2, or USR1 where USR2 saves and stops."""
    if save_signal is None:
        return None
    return "USR1" if save_signal == "USR2" else "USR2"


class SlurmJobOptions(ProgramOptions, SharedOptions):
    """What the user asked ``distlaunch slurm run`` / ``sbatch`` for; None means: take it from the allocation.
    nproc_per_node is distlaunch's name for ntasks_per_node: both given must agree."""

    nodes: int | None = None
    ntasks_per_node: int | None = None
    ntasks: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str | None = None
    python: str = sys.executable
    save_signal: str | None = DEFAULT_SAVE_SIGNAL  # None: --save-signal none
    save_signal_given: bool = False  # typed: the user says the program saves on it (as the bundled engine does)
    requeue: bool = False  # run: requeue the batch job once its ranks saved on request; sbatch: write it so
    signal_lead: int | None = None  # sbatch --signal-lead: seconds; None: computed (slurm/lead.py)
    grace_period: float = GRACE_PERIOD_S  # run: from SIGTERM (or the save signal it passes on first) to the next
    cpu_bind: str = "auto"  # --cpu-bind: each task applies it to itself unless Slurm bound it (slurm/task.py)


def job_options(values: Mapping[str, Any]) -> SlurmJobOptions:
    """The job options from each option's value by name, as ``slurm run|sbatch`` parsed them: an option left unset
    (None) takes its default, and so does an empty --python (the launcher's own). ``--save-signal none`` is None,
    kept as such; ``save_signal_given``: --save-signal was typed."""
    fields = {k: v for k, v in values.items() if k in SlurmJobOptions.model_fields and v is not None}
    if not values.get("python"):
        fields.pop("python", None)
    if "save_signal" in values:
        fields["save_signal"] = values["save_signal"]
    return SlurmJobOptions(**fields)


class JobShape(BaseModel):
    """How many nodes, tasks and GPUs, and where: the part of a job that srun and #SBATCH lines say."""

    nodes: int
    ntasks_per_node: int
    world_size: int
    gpus_per_node: int
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str | None = None


class SlurmJob(JobShape):
    """A checked job shape and the commands that run it."""

    parallel: Layout
    allocation: str | None  # the job id when already inside an allocation (srun then starts a step in it)
    rank_command: list[str]  # what every task runs
    srun: list[str]
    save_signal: str | None  # every rank's DISTLAUNCH_SAVE_SIGNAL; distlaunch passes it on to them
    # the ranks save on it (the bundled engine, or --save-signal typed): a SIGTERM passes it on first
    saves_on_signal: bool
    requeue: bool


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} {value} must be at least 1", f"give a positive {flag}")


def _count(environ: Mapping[str, str], name: str) -> int | None:
    """An allocation's count variable; GPU counts may carry a type, e.g. SLURM_GPUS_PER_NODE=a100:4."""
    match = re.search(r"(\d+)$", environ.get(name, ""))
    return int(match.group(1)) if match else None


def tasks_per_node(opts: SlurmJobOptions, nodes: int, environ: Mapping[str, str]) -> int:
    """--ntasks-per-node (or -n), else --ntasks / nodes, else the allocation's (its tasks per node, or its
    --ntasks over its nodes), else one per GPU, else 1."""
    given = opts.ntasks_per_node
    # -n auto|gpu: the nodes count their own GPUs (each task checks it there); the allocation says the tasks here
    nproc = opts.nproc_per_node if isinstance(opts.nproc_per_node, int) else None
    if given is not None and nproc is not None and given != nproc:
        raise UsageError(
            f"--ntasks-per-node {given} and -n/--nproc-per-node {nproc} disagree: under Slurm each task is one "
            f"rank (distlaunch starts no extra processes), so {given} tasks × {nproc} processes would be "
            f"{given * nproc} ranks per node",
            f"give one of them: --ntasks-per-node {nproc}",
        )
    if given or nproc:
        return given or nproc
    if opts.ntasks is not None:
        if opts.ntasks % nodes:
            raise UsageError(
                f"--ntasks {opts.ntasks} does not split evenly over {plural(nodes, 'node')}",
                f"use a multiple of {nodes}, or give --ntasks-per-node",
            )
        return opts.ntasks // nodes
    return (
        _count(environ, "SLURM_NTASKS_PER_NODE")
        or _allocation_tasks(environ, nodes)
        or opts.gpus_per_node
        or _count(environ, "SLURM_GPUS_PER_NODE")
        or 1
    )


def _allocation_tasks(environ: Mapping[str, str], nodes: int) -> int | None:
    """An allocation made with -n (``sbatch -N2 -n4``): its tasks per node, when this run spans all its nodes.
    One that does not split evenly is refused: every node runs the same number of ranks here."""
    tasks = _count(environ, "SLURM_NTASKS")
    allocated = _count(environ, "SLURM_JOB_NUM_NODES") or _count(environ, "SLURM_NNODES")
    if tasks is None or allocated != nodes:
        return None
    if tasks % nodes:
        raise UsageError(
            f"the allocation has {plural(tasks, 'task')} (SLURM_NTASKS) on {plural(nodes, 'node')}: they do not split evenly, and "
            "distlaunch runs the same number of ranks on every node",
            "give --ntasks-per-node N (or allocate with --ntasks-per-node)",
        )
    return tasks // nodes


def check_gpus(gpus: int, per_node: int) -> None:
    """One GPU per rank: fewer means two ranks on one GPU, more means GPUs paid for and idle."""
    if gpus and gpus < per_node:
        raise UsageError(
            f"--ntasks-per-node {per_node} with --gpus-per-node {gpus}: two ranks would be given the same GPU",
            f"run one rank per GPU: --ntasks-per-node {gpus} (or --gpus-per-node {per_node})",
        )
    if gpus > per_node:
        raise UsageError(
            f"--gpus-per-node {gpus} with --ntasks-per-node {per_node}: {plural(gpus - per_node, 'GPU')} per node would idle",
            f"run one rank per GPU: --ntasks-per-node {gpus}",
        )


def job_parallel(text: str | None, nodes: int, per_node: int) -> Layout:
    """Resolve --parallel against nodes × ntasks-per-node; tp groups must stay inside a node."""

    def ranks(n: int) -> str:
        return f"-N {nodes} --ntasks-per-node {n // nodes}" if n % nodes == 0 else f"a world size of {n}"

    layout = resolve_layout(layout_spec(text), nodes * per_node, ranks)
    group = tp_group_across_nodes(layout, lambda rank: rank // per_node)
    if group is not None:
        raise UsageError(
            f"--parallel tp={layout.tp}: tensor-parallel group of ranks {group[0]}..{group[-1]} would span nodes "
            f"({per_node} tasks per node)",
            f"use --ntasks-per-node a multiple of {layout.tp}, or lower tp",
        )
    return layout


def forwarded_options(opts: SlurmJobOptions) -> list[str]:
    """The launch options every task's ``distlaunch run`` gets (the job shape is srun's business)."""
    argv = []
    for flag, value in (("--parallel", opts.parallel), ("--master-addr", opts.master_addr)):
        if value:
            argv += [flag, value]
    if opts.master_port != "auto":
        argv += ["--master-port", opts.master_port]
    if opts.backend != "auto":
        argv += ["--backend", opts.backend]
    if opts.cpu_bind != "auto":  # each task binds itself by it, as a host's agent binds its ranks
        argv += ["--cpu-bind", opts.cpu_bind]
    # --env values never go on a command line (ps shows it to every user of the node): they travel
    # in srun's / sbatch's environment, and --export names them (export_option)
    return argv + (["-m"] if opts.module else []) + (["--no-python"] if opts.no_python else [])


def wrapper_options(opts: SlurmJobOptions) -> list[str]:
    """What a batch script's ``distlaunch slurm run`` line gets: the ranks' options, and the save signal and
    ``--requeue`` where they are not run's defaults (the shape is the #SBATCH lines' business)."""
    argv = forwarded_options(opts)
    if opts.grace_period != GRACE_PERIOD_S:
        argv[:0] = ["--grace-period", f"{opts.grace_period:g}"]
    if opts.save_signal_given or opts.save_signal != DEFAULT_SAVE_SIGNAL:
        argv[:0] = ["--save-signal", opts.save_signal or "none"]
    return (["--requeue"] if opts.requeue else []) + argv


def export_names(opts: SlurmJobOptions, default: str | None) -> list[str]:
    """The variables srun must export besides its default: the --env names, and the save signal's where the
    default (``SLURM_EXPORT_ENV``) is not ALL, so that every rank still sees it."""
    names = list(parse_env(opts.env))
    base = (default or "ALL").split(",")[0].upper()
    if opts.save_signal and base != "ALL":
        names += [SAVE_SIGNAL_VAR, CHECKPOINT_SIGNAL_VAR]
    return names


def export_option(names: list[str], default: str | None) -> str | None:
    """``--export=ALL,NAME...``: the --env names (never their values) added to what srun/sbatch would export.

    ``default`` is the site's or user's setting (SLURM_EXPORT_ENV for srun, SBATCH_EXPORT for sbatch).
    """
    if not names:
        return None
    base = [] if (default or "ALL").upper() in ("NONE", "NIL") else (default or "ALL").split(",")
    return ",".join(dict.fromkeys([*base, *names]))


def srun_env(opts: SlurmJobOptions, job: SlurmJob) -> dict[str, str]:
    """srun's environment besides this one's: the --env values, and the save signal every rank saves on."""
    env = parse_env(opts.env)
    if job.save_signal:
        env[SAVE_SIGNAL_VAR] = job.save_signal
        env[CHECKPOINT_SIGNAL_VAR] = checkpoint_signal(job.save_signal)
    return env


def rank_command(opts: SlurmJobOptions) -> list[str]:
    """``python -m distlaunch run --launcher slurm [launch options] -- PROGRAM``: what each task runs."""
    return [
        opts.python,
        "-m",
        "distlaunch",
        "run",
        "--launcher",
        "slurm",
        *forwarded_options(opts),
        "--",
        *opts.program,
    ]


def srun_command(shape: JobShape, opts: SlurmJobOptions, environ: Mapping[str, str] | None = None) -> list[str]:
    """srun with one task per rank; --kill-on-bad-exit so one failing rank stops the whole step."""
    argv = [
        "srun",
        f"--nodes={shape.nodes}",
        f"--ntasks={shape.world_size}",
        f"--ntasks-per-node={shape.ntasks_per_node}",
        "--kill-on-bad-exit=1",
        "--label",
    ]
    if shape.gpus_per_node:
        # Every task sees all GPUs of its node and picks cuda:LOCAL_RANK, as under torchrun.
        argv += [f"--gpus-per-node={shape.gpus_per_node}", "--gpu-bind=none"]
    for flag in ("cpus_per_task", "partition", "account", "time", "job_name"):
        value = getattr(shape, flag)
        if value is not None:
            argv.append(f"--{flag.replace('_', '-')}={value}")
    default = (environ or {}).get("SLURM_EXPORT_ENV")
    export = export_option(export_names(opts, default), default)
    if export:
        argv.append(f"--export={export}")
    return argv + rank_command(opts)


def _check_program(opts: SlurmJobOptions) -> None:
    program = LaunchOptions(program=opts.program, module=opts.module, no_python=opts.no_python)
    build_command(program)
    check_script(program, hint="check the path (tasks start in this directory), or use -m MODULE")


def resolve_job(opts: SlurmJobOptions, environ: Mapping[str, str]) -> SlurmJob:
    """Fill in what the allocation (if any) says, check the shape, and build the srun command."""
    for flag, value in (
        ("-N/--nodes", opts.nodes),
        ("--ntasks-per-node", opts.ntasks_per_node),
        ("-n/--nproc-per-node", opts.nproc_per_node if isinstance(opts.nproc_per_node, int) else None),
        ("--ntasks", opts.ntasks),
        ("--cpus-per-task", opts.cpus_per_task),
    ):
        _positive(flag, value)
    _check_program(opts)
    parse_env(opts.env)
    if opts.master_port != "auto":
        parse_port(opts.master_port)
    nodes = opts.nodes or _count(environ, "SLURM_JOB_NUM_NODES") or _count(environ, "SLURM_NNODES") or 1
    per_node = tasks_per_node(opts, nodes, environ)
    if opts.ntasks is not None and opts.ntasks != nodes * per_node:
        raise UsageError(
            f"--ntasks {opts.ntasks} != -N {nodes} × --ntasks-per-node {per_node} = {nodes * per_node}",
            "give two of --nodes, --ntasks-per-node, --ntasks",
        )
    gpus = opts.gpus_per_node if opts.gpus_per_node is not None else (_count(environ, "SLURM_GPUS_PER_NODE") or 0)
    check_gpus(gpus, per_node)
    check_sets(opts.cpu_bind, per_node, None)  # a list: one set per task of a node (their CPUs: on the node)
    cpus = opts.cpus_per_task or _count(environ, "SLURM_CPUS_PER_TASK")  # srun >= 22.05 no longer inherits it
    shape = JobShape(
        nodes=nodes,
        ntasks_per_node=per_node,
        world_size=nodes * per_node,
        gpus_per_node=gpus,
        cpus_per_task=cpus,
        partition=opts.partition,
        account=opts.account,
        time=opts.time,
        job_name=opts.job_name,
    )
    return SlurmJob(
        **shape.model_dump(),
        parallel=job_parallel(opts.parallel, nodes, per_node),
        allocation=environ.get("SLURM_JOB_ID"),
        rank_command=rank_command(opts),
        srun=srun_command(shape, opts, environ),
        save_signal=opts.save_signal,
        saves_on_signal=opts.save_signal is not None and (opts.save_signal_given or is_engine(opts)),
        requeue=opts.requeue,
    )
