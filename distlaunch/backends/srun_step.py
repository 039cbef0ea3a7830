"""Inside an srun step: this task becomes one rank and execs the program (distlaunch/slurm/task.py).

Slurm started every task and watches them; distlaunch only maps Slurm's variables to the torchrun contract.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from distlaunch.backends.base import Backend, LaunchRequest
from distlaunch.contract.sink import Sink
from distlaunch.errors import UsageError

if TYPE_CHECKING:
    from distlaunch.contract.report import RunReport
    from distlaunch.slurm.env import SlurmRank

log = logging.getLogger("distlaunch")

LAUNCHERS = ("auto", "slurm", "agent")


class SrunStep(Backend["SlurmRank"]):
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

    def plan(self, request: LaunchRequest) -> SlurmRank:
        """This task's rank, with every variable distlaunch adds or changes (not only the contract): what the
        dry-run shows, and what ``run`` execs with."""
        from distlaunch.slurm.task import rank_for_task, task_env

        rank = rank_for_task(request.opts, os.environ)
        env = task_env(rank, request.opts, os.environ)
        added = {k: v for k, v in env.items() if k in rank.env or os.environ.get(k) != v}
        return rank.model_copy(update={"env": added})

    def run(self, request: LaunchRequest, plan: SlurmRank, sink: Sink) -> RunReport:
        from distlaunch.slurm.task import exec_rank

        exec_rank(plan, request.opts, os.environ)  # never returns


def wanted(launcher: str) -> bool:
    """--launcher slurm, or auto inside an srun task; in an allocation outside srun, say why it runs here only."""
    from distlaunch.slurm.step import in_srun_step

    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r} is not a launcher", f"use {', '.join(LAUNCHERS)}")
    if launcher != "auto":
        return launcher == "slurm"
    if in_srun_step(os.environ):
        return True
    if os.environ.get("SLURM_JOB_ID"):
        log.warning(
            f"inside Slurm job {os.environ['SLURM_JOB_ID']} but not in an srun step: starting the "
            "ranks on this node only (srun distlaunch run ... or distlaunch slurm run ... uses every node)"
        )
    return False
