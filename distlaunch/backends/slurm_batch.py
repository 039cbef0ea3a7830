"""Slurm batch jobs: ``distlaunch slurm sbatch`` writes a batch script from the template and submits it; Slurm
runs the job. Its state comes from scontrol/sacct, ``stop`` is scancel, its output is the job's output file.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from distlaunch.backends.base import remember
from distlaunch.backends.output import FileOutput
from distlaunch.errors import DistlaunchError, HostError, UsageError
from distlaunch.jobs.store import JobRecord, write_record

if TYPE_CHECKING:
    from distlaunch.launcher.snapshots import StacksSnapshot
    from distlaunch.slurm.job import SlurmJob, SlurmJobOptions
    from distlaunch.slurm.sbatch import SbatchResult

log = logging.getLogger("distlaunch")


# Slurm's states as the registry's: pending and running as they are, the rest by how the job ended.
_SLURM_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "stopped",
}


class SlurmBatch(FileOutput):
    """Batch jobs submitted by ``distlaunch slurm sbatch``: scontrol/sacct, scancel, the job's output file."""

    name = "slurm"
    records = ("slurm",)

    def submit(
        self,
        opts: SlurmJobOptions,
        output: str | None,
        template: Path | None,
        wait: bool,
        out: TextIO,
        command: list[str],
    ) -> SbatchResult:
        """Write the batch script, submit it, record the job (``slurm-<id>``); with ``wait``, follow it to its end."""
        from distlaunch.contract.env import parse_env
        from distlaunch.slurm.sbatch import default_job_name, submit

        job, script = self.script(opts, output, template)
        return submit(
            script,
            wait=wait,
            job_name=job.job_name or default_job_name(opts),
            output=output,
            out=out,
            env=parse_env(opts.env),
            on_submitted=lambda submitted: record_batch_job(
                submitted.job_id,
                submitted.output,
                job.world_size,
                job.nodes,
                job.parallel.model_dump(mode="json"),
                command,
                opts.backend,
            ),
        )

    def script(self, opts: SlurmJobOptions, output: str | None, template: Path | None) -> tuple[SlurmJob, str]:
        """The job as Slurm will run it, and its batch script (what ``--dry-run`` prints)."""
        from distlaunch.slurm.job import resolve_job
        from distlaunch.slurm.sbatch import render_script

        job = resolve_job(opts, {})  # the script asks for its own allocation: ignore the one we may be in
        return job, render_script(job, opts, output, template)

    def stacks(self, record: JobRecord, timeout: float) -> StacksSnapshot:
        raise UsageError(
            f"job {record.job_id} is a slurm job: distlaunch stacks reaches only jobs of run and train",
            "run py-spy dump --pid PID on its nodes (srun --jobid ID --overlap); for distlaunch train, "
            "train.step_timeout prints a hung rank's stacks by itself",
        )

    def current(self, record: JobRecord) -> JobRecord:
        if record.final or record.native_id is None:
            return record
        from distlaunch.slurm.jobstate import SlurmUnanswered, exit_code_of, job_state

        try:
            found = job_state(record.native_id)
        except SlurmUnanswered as exc:  # the state is unknown, not gone: the caller keeps the last known one
            raise SlurmUnanswered(exc.message, f"its last known state is {record.state}; {exc.hint}") from None
        except OSError:  # no Slurm client here (another login node): unknown, as when slurmctld does not answer
            raise SlurmUnanswered(
                "Slurm's client commands (scontrol, sacct) are not installed here",
                f"its last known state is {record.state}; run distlaunch on a Slurm login node to see it now",
            ) from None
        if found is None:  # slurmctld answered that it has no such job, and sacct has none either
            return record.model_copy(update={"state": "lost", "error": "Slurm no longer knows this job"})
        state = _SLURM_STATES.get(found.state, "failed")
        update: dict = {"state": state, "error": None if state != "failed" else f"Slurm state {found.state}"}
        update.update(_slurm_nodes(record, found.nodes, found.node_list))
        if state in ("succeeded", "stopped", "failed"):
            update.update(exit_code=exit_code_of(found.state, found.exit_code), ended_at=time.time())
            now = record.model_copy(update=update)
            write_record(now)  # final: later reads need no Slurm
            return now
        return remember(record, record.model_copy(update=update))

    def request_stop(self, record: JobRecord) -> None:
        from distlaunch.slurm.jobstate import slurm_command  # bounded; a timeout is SlurmUnanswered (exit 3)

        try:
            done = slurm_command(["scancel", "--full", record.native_id or ""])
        except FileNotFoundError:
            raise HostError("'scancel' not found here", "run 'distlaunch stop' on a Slurm login node") from None
        if done.returncode:
            said = next((line.strip() for line in done.stderr.splitlines() if line.strip()), f"exit {done.returncode}")
            raise HostError(
                f"scancel {record.native_id} failed: {said}",
                f"the job may still run: check it with squeue -j {record.native_id}",
            )

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        if stderr:  # sbatch writes both streams to one file unless the template says otherwise
            raise UsageError(f"job {record.job_id} is a Slurm job: its stderr is in its output file", "drop --stderr")
        if not record.output:
            raise UsageError(f"job {record.job_id} writes per-node or per-task files", "look at its --output files")
        return Path(record.output)


def _slurm_nodes(record: JobRecord, nodes: int | None, node_list: str | None) -> dict:
    """The job's hosts and per-node ranks once Slurm has given it nodes (block distribution: the batch script's
    srun takes --ntasks-per-node from the allocation), and its node count from the start."""
    update: dict = {}
    plan = dict(record.plan)
    if nodes:
        plan["nnodes"] = nodes
    if node_list:
        from distlaunch.slurm.step import expand_nodelist

        try:
            hosts = expand_nodelist(node_list)
        except DistlaunchError:
            hosts = []
        if hosts:
            per_node, spread = divmod(record.world_size, len(hosts))
            plan["nodes"] = [
                {"host": host, "node_rank": i,
                 "ranks": [{"rank": i * per_node + k} for k in range(per_node)] if not spread else []}
                for i, host in enumerate(hosts)
            ]  # fmt: skip
            update["hosts"] = hosts
    if plan != record.plan:
        update["plan"] = plan
    return update


def record_batch_job(
    slurm_id: str, output: str | None, world_size: int, nodes: int, parallel: dict, command: list[str], backend: str
) -> None:
    """Record a submitted Slurm batch job (``slurm-<id>``): Slurm runs it, ``distlaunch jobs`` asks Slurm about it."""
    record = JobRecord(
        job_id=f"slurm-{slurm_id}",
        backend="slurm",
        command=command,
        cwd=os.getcwd(),
        hosts=[f"({nodes} node{'s' * (nodes > 1)})"],
        world_size=world_size,
        state="pending",
        native_id=slurm_id,
        output=os.path.abspath(output) if output else None,
        plan={"parallel": parallel, "backend": backend, "nodes": []},  # the ranks' (auto: chosen on the nodes)
    )
    try:
        write_record(record)
    except OSError as exc:
        log.warning("cannot record Slurm job %s: %s", slurm_id, exc)
