"""``distlaunch run``: start a script on every rank (torchrun-compatible environment)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer
from pydantic import BaseModel
from rich.console import Console

from distlaunch.backends.base import LaunchRequest
from distlaunch.backends.registry import select
from distlaunch.cli import options as o
from distlaunch.cli.output import RankPrinter
from distlaunch.cli.render import masked, print_json, render_plan, render_report
from distlaunch.contract.options import LaunchOptions
from distlaunch.jobs.store import JobRecord
from distlaunch.launcher.job import ExecOptions
from distlaunch.launcher.pernode import NodeOptions
from distlaunch.protocol import GRACE_PERIOD_S


def run(
    ctx: typer.Context,
    program: Annotated[
        list[str],
        typer.Argument(
            help="SCRIPT [ARGS]... (or MODULE [ARGS]... with -m). Everything after SCRIPT goes to the script.",
            show_default=False,
        ),
    ],
    module: Annotated[bool, typer.Option("-m", "--module", help="Run PROGRAM as a module, like python -m.")] = False,
    no_python: Annotated[
        bool, typer.Option("--no-python", help="Run PROGRAM as an executable, not through Python.")
    ] = False,
    hostfile: o.Hostfile = None,
    nproc_per_node: o.NprocPerNode = None,
    parallel: o.ParallelOpt = None,
    include: o.Include = None,
    exclude: o.Exclude = None,
    master_addr: o.MasterAddr = None,
    master_port: o.MasterPort = "auto",
    backend: o.Backend = "auto",
    max_restarts: o.MaxRestarts = 0,
    log_dir: o.LogDir = None,
    env: o.Env = None,
    ssh_config: o.SshConfig = None,
    python: o.Python = None,
    accept_new_host_keys: o.AcceptNewHostKeys = False,
    remote_python: o.RemotePython = None,
    workdir: o.Workdir = None,
    grace_period: o.GracePeriod = GRACE_PERIOD_S,
    heartbeat_timeout: o.HeartbeatTimeout = 30.0,
    local_ranks_filter: o.LocalRanksFilter = None,
    hang_timeout: o.HangTimeout = 0.0,
    dry_run: o.DryRun = False,
    detach: o.Detach = False,
    json_output: o.Json = False,
    launcher: o.Launcher = "auto",
    nnodes: o.NNodes = None,
    node_rank: o.NodeRank = None,
    node_rank_alias: o.NodeRankAlias = None,
    rdzv_endpoint: o.RdzvEndpoint = None,
    rdzv_endpoint_alias: o.RdzvEndpointAlias = None,
    rdzv_timeout: o.RdzvTimeout = 300.0,
) -> int:
    """Start SCRIPT on every rank of every host, stream their output, stop them all if one fails.

    Each rank gets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, NNODES and DISTLAUNCH_JOB_ID, so a script written for torchrun runs unchanged.

    Exit code: 0 on success, 1 for an internal error, 2 for bad input, 3 when a host cannot be reached or goes silent (--heartbeat-timeout), 124 when the job hung (--hang-timeout: every rank's stack is gathered first), the first failing rank's code otherwise (128+N if killed by signal N, 127/126 when its program was not found / could not be executed, 255 when its host's agent was lost), 130/143/129 after Ctrl-C / SIGTERM / a closed terminal (SIGHUP).
    """
    opts = LaunchOptions(
        program=program,
        module=module,
        no_python=no_python,
        hostfile=hostfile,
        nproc_per_node=nproc_per_node,
        parallel=parallel,
        include=include,
        exclude=exclude,
        master_addr=master_addr,
        master_port=master_port,
        backend=backend,
        env=env or [],
        ssh_config=ssh_config,
        accept_new_host_keys=accept_new_host_keys,
        remote_python=remote_python,
        python=python or "",
        max_restarts=max_restarts,
    )
    exec_opts = ExecOptions(
        grace_period=grace_period,
        max_restarts=max_restarts,
        log_dir=log_dir,
        workdir=workdir,
        heartbeat_timeout=heartbeat_timeout,
        hang_timeout=hang_timeout,
        local_ranks_filter=o.parse_local_ranks(local_ranks_filter),
    )
    node_rank = node_rank if node_rank is not None else node_rank_alias
    rdzv_endpoint = rdzv_endpoint or rdzv_endpoint_alias
    node = None
    if nnodes is not None or node_rank is not None or rdzv_endpoint is not None:  # per-node mode (docs/multinode.md)
        node = NodeOptions(
            nnodes=1 if nnodes is None else nnodes,
            node_rank=node_rank,
            rdzv_endpoint=rdzv_endpoint,
            rdzv_timeout=rdzv_timeout,
        )
    request = LaunchRequest(
        opts=opts,
        exec_opts=exec_opts,
        node=node,
        launcher=launcher,
        command=command_line(),
        supervision_given=o.given_flags(ctx),
    )
    return start(request, dry_run=dry_run, json_output=json_output, detach=detach)


def command_line() -> list[str]:
    """This command as the user typed it (kept in the job record)."""
    return ["distlaunch", *sys.argv[1:]]


def start(
    request: LaunchRequest,
    *,
    dry_run: bool,
    json_output: bool,
    detach: bool,
    refine: Callable[[BaseModel], BaseModel] = lambda plan: plan,
    describe: Callable[[BaseModel, Console], None] = lambda plan, console: None,
) -> int:
    """The one path of ``run`` and ``train``: pick the backend, plan, then show the plan (--dry-run), hand it to
    a supervisor (--detach), or run it with live rank output and the root-cause table. ``refine`` adds to the
    plan (train: the memory estimate) and ``describe`` shows what it added."""
    backend = select(request, detach)
    plan = refine(backend.plan(request))
    if dry_run:
        if json_output:
            print_json(masked(plan))
        else:
            console = Console()
            render_plan(plan, console)
            describe(plan, console)
        return 0
    if detach:
        return report_detached(backend.detach(request, plan), json_output)
    # With --json, stdout carries only the report: rank output goes to stderr.
    sink = RankPrinter(multi_host=getattr(plan, "nnodes", 1) > 1, out=sys.stderr if json_output else None)
    try:
        report = backend.run(request, plan, sink)
    finally:
        sink.close()  # what the terminal still takes, never waiting on a stalled one
    render_report(report, Console(stderr=True))
    if json_output:
        print_json(report)
    return report.exit_code


def report_detached(record: JobRecord, json_output: bool) -> int:
    """Print the detached job's id (or its record as JSON) and how to follow it."""
    if json_output:
        print_json(record)
    else:
        print(record.job_id)
        Console(stderr=True).print(
            f"job {record.job_id} runs in the background ({record.world_size} ranks, supervisor pid "
            f"{record.owner.pid}): distlaunch logs {record.job_id} --follow | status | stop",
            highlight=False,
        )
    return 0
