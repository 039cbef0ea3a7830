"""Where a job's ranks start: one interface, one registry.

A backend turns the launch options into what it would start (``plan``: what ``--dry-run`` shows) and starts
it (``run``). The commands pick one by ``--launcher`` or by context (``select``) and hold no backend code of
their own, so a new backend is one class here plus its own package. Jobs that outlive the command
(``distlaunch jobs/status/logs/stop/stacks``) are answered by the registry in distlaunch/jobs/backends.py.

- ``hosts``: this machine and SSH hosts from a hostfile, one agent per host (distlaunch/launcher, remote).
- ``node``: this node's part of a job started once per node (--nnodes, torchrun's multi-node form).
- ``srun-step``: inside an srun step, this task becomes one rank and execs the program (distlaunch/slurm).
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from typing import ClassVar

from pydantic import BaseModel

from distlaunch.contract.options import LaunchOptions
from distlaunch.errors import UsageError
from distlaunch.jobs.store import JobRecord
from distlaunch.launcher.job import ExecOptions, Sink
from distlaunch.launcher.pernode import NodeOptions
from distlaunch.launcher.report import RunReport

LAUNCHERS = ("auto", "slurm", "agent")


class LaunchRequest(BaseModel):
    """What the user asked for, as ``run`` and ``train`` resolved it from the command line."""

    opts: LaunchOptions
    exec_opts: ExecOptions = ExecOptions()
    node: NodeOptions | None = None  # per-node mode: --nnodes / --node-rank / --rdzv-endpoint
    launcher: str = "auto"  # --launcher: auto | slurm | agent
    command: list[str] = []  # the command line, kept in the job record
    supervision_given: list[str] = []  # supervision flags typed on the command line (--hang-timeout, ...)


class Backend(ABC):
    name: ClassVar[str]

    def check(self, request: LaunchRequest, detach: bool) -> None:
        """Refuse options this backend cannot honour, before anything starts (one line, exit 2)."""
        if detach:
            raise UsageError(
                f"--detach is not available for a {self.name} launch",
                "run it in the foreground, in the background with your own tools (nohup, your container)",
            )

    @abstractmethod
    def plan(self, request: LaunchRequest) -> BaseModel:
        """What would start, checked as a real run checks it (what --dry-run prints)."""

    @abstractmethod
    def run(self, request: LaunchRequest, plan: BaseModel, sink: Sink) -> RunReport:
        """Start ``plan``, stream rank output to ``sink``, and say how the job ended."""

    def detach(self, request: LaunchRequest, plan: BaseModel) -> JobRecord:
        raise AssertionError("check() refuses --detach for this backend")  # pragma: no cover


class Hosts(Backend):
    name = "hosts"

    def check(self, request: LaunchRequest, detach: bool) -> None:
        pass  # every option applies; --detach hands the plan to a supervisor

    def plan(self, request: LaunchRequest):
        from distlaunch.launcher.launch import check_shown_local_ranks, plan_for

        plan = plan_for(request.opts, request.exec_opts.workdir)
        check_shown_local_ranks(plan, request.exec_opts.local_ranks_filter)
        return plan

    def run(self, request: LaunchRequest, plan, sink: Sink) -> RunReport:
        from distlaunch.launcher.launch import launch

        return launch(plan, request.opts, request.exec_opts, sink, command=request.command)

    def detach(self, request: LaunchRequest, plan) -> JobRecord:
        from distlaunch.jobs.supervisor import DetachedLaunch, detach
        from distlaunch.launcher.launch import check_launch

        check_launch(plan, request.opts)  # what a foreground run checks, before the supervisor starts
        return detach(
            DetachedLaunch(plan=plan, opts=request.opts, exec_opts=request.exec_opts, command=request.command)
        )


class Node(Backend):
    name = "per-node (--nnodes)"

    def plan(self, request: LaunchRequest):
        from distlaunch.launcher.pernode import dry_run_plan

        return dry_run_plan(request.opts, request.node, request.exec_opts.workdir)

    def run(self, request: LaunchRequest, plan, sink: Sink) -> RunReport:
        from distlaunch.launcher.pernode import launch_node

        return launch_node(request.opts, request.node, request.exec_opts, sink)


class SrunStep(Backend):
    name = "srun step"

    def check(self, request: LaunchRequest, detach: bool) -> None:
        super().check(request, detach)
        exec_opts = request.exec_opts
        if exec_opts.max_restarts or exec_opts.log_dir:
            flag = "--max-restarts" if exec_opts.max_restarts else "--log-dir"
            raise UsageError(
                f"{flag} cannot be used under srun: each task is one rank and distlaunch execs into it",
                "requeue with sbatch --requeue for restarts; use srun --output=rank%t.log for per-rank logs",
            )
        if request.supervision_given:  # taken and then silently ignored, before: nothing supervises a task
            raise UsageError(
                f"{request.supervision_given[0]} cannot be used under srun: each task is one rank and distlaunch "
                "execs into it, so nothing watches or stops the ranks but Slurm",
                "leave it out (srun --kill-on-bad-exit stops the step, --time bounds it); distlaunch train's ranks "
                "watch their own steps (train.step_timeout)",
            )

    def plan(self, request: LaunchRequest):
        """This task's rank, with every variable distlaunch adds or changes (not only the contract): what the
        dry-run shows, and what ``run`` execs with."""
        from distlaunch.slurm.task import rank_for_task, task_env

        rank = rank_for_task(request.opts, os.environ)
        env = task_env(rank, request.opts, os.environ)
        added = {k: v for k, v in env.items() if k in rank.env or os.environ.get(k) != v}
        return rank.model_copy(update={"env": added})

    def run(self, request: LaunchRequest, plan, sink: Sink) -> RunReport:
        from distlaunch.slurm.task import exec_rank

        exec_rank(plan, request.opts, os.environ)  # never returns


def slurm_step_wanted(launcher: str) -> bool:
    """--launcher slurm, or auto inside an srun task; in an allocation outside srun, say why it runs here only."""
    from distlaunch.slurm.step import in_srun_step

    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r} is not a launcher", f"use {', '.join(LAUNCHERS)}")
    if launcher != "auto":
        return launcher == "slurm"
    if in_srun_step(os.environ):
        return True
    if os.environ.get("SLURM_JOB_ID"):
        sys.stderr.write(
            f"distlaunch: inside Slurm job {os.environ['SLURM_JOB_ID']} but not in an srun step: starting the "
            "ranks on this node only (srun distlaunch run ... or distlaunch slurm run ... uses every node)\n"
        )
    return False


def select(request: LaunchRequest, detach: bool = False) -> Backend:
    """The backend for this request, its options checked."""
    if slurm_step_wanted(request.launcher):
        backend: Backend = SrunStep()
    elif request.node is not None:
        backend = Node()
    else:
        backend = Hosts()
    backend.check(request, detach)
    return backend
