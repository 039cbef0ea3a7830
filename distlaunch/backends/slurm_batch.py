"""Slurm batch jobs: ``distlaunch slurm sbatch`` writes a batch script from the template and submits it; Slurm
runs the job. Its state comes from scontrol/sacct, ``stop`` is scancel, its output is the job's output file.
The batch script runs ``distlaunch slurm run``, the srun wrapper, which runs here too (``srun``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from distlaunch.backends.base import CheckpointSaved, Submission, remember
from distlaunch.backends.output import FileOutput
from distlaunch.contract.options import DEFAULT_SAVE_SIGNAL
from distlaunch.contract.report import REQUEUE_CODE
from distlaunch.errors import DistlaunchError, HostError, NoAnswer, UsageError
from distlaunch.jobs.store import JobRecord, write_record
from distlaunch.slurm.saves import batch_job_id

if TYPE_CHECKING:
    from distlaunch.contract.report import StacksSnapshot
    from distlaunch.slurm.job import SlurmJob, SlurmJobOptions
    from distlaunch.slurm.lead import SignalLead
    from distlaunch.slurm.sbatch import SbatchResult
    from distlaunch.slurm.srun import SrunResult

log = logging.getLogger("distlaunch")


# Slurm's states as the registry's: pending and running as they are, the rest by how the job ended.
_SLURM_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",  # requeued and held (scontrol release)
    "REQUEUE_FED": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "stopped",
}


@dataclass(frozen=True)
class BatchJob:
    """A batch job as sbatch is handed it: the options as typed, the job they resolve to, where its output goes,
    and whether ``slurm sbatch`` follows it to its end (--wait)."""

    opts: SlurmJobOptions
    job: SlurmJob
    output: str | None
    wait: bool


class SlurmBatch(FileOutput):
    """Batch jobs submitted by ``distlaunch slurm sbatch``: scontrol/sacct, scancel, the job's output file; and
    ``distlaunch slurm run``, the srun wrapper their batch script runs."""

    name = "slurm"
    records = ("slurm",)

    def submission(self, options: Mapping[str, Any]) -> Submission[BatchJob]:
        """The batch script for ``slurm sbatch``'s options (what --dry-run prints), the job it runs and how far
        ahead of its time limit it is warned. By default the job requeues itself after a save on the save signal;
        --no-requeue or --save-signal none: it just ends."""
        from distlaunch.slurm.job import job_options

        opts = job_options(options)
        requeue = not options.get("no_requeue") and opts.save_signal is not None
        if not requeue and opts.signal_lead is not None:
            flag = "--no-requeue" if options.get("no_requeue") else "--save-signal none"
            raise UsageError(
                f"--signal-lead with {flag}: nothing is warned ahead of the time limit", "give one of them"
            )
        opts = opts.model_copy(update={"requeue": requeue})
        output = options.get("output")
        job, script, lead = self.script(opts, output, options.get("template"))
        shown_lead = None if lead is None else lead.model_dump(mode="json")
        data = {"job": job.model_dump(mode="json"), "script": script, "signal_lead": shown_lead}
        return Submission(request=BatchJob(opts, job, output, bool(options.get("wait"))), text=script, data=data)

    def submit(self, submission: Submission[BatchJob], out: TextIO, command: list[str]) -> SbatchResult:
        """Submit the batch script and record the job (``slurm-<id>``); with --wait, follow its output to ``out``
        until it ends."""
        from distlaunch.contract.env import parse_env
        from distlaunch.slurm.sbatch import default_job_name, submit

        opts, job = submission.request.opts, submission.request.job
        return submit(
            submission.text,
            wait=submission.request.wait,
            job_name=job.job_name or default_job_name(opts),
            output=submission.request.output,
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
                save_signal=job.save_signal,
            ),
        )

    def srun_job(self, options: Mapping[str, Any]) -> SlurmJob:
        """``slurm run``: the job as srun starts it, in this allocation or asking for one (what --dry-run prints)."""
        from distlaunch.slurm.job import job_options, resolve_job

        return resolve_job(job_options(options), os.environ)

    def srun(self, options: Mapping[str, Any], out: TextIO | None) -> SrunResult:
        """``slurm run``: run the job with srun, one task per rank, its output to ``out`` (None: stdout); pass the
        save signal on to every rank, and requeue the batch job it runs in once they saved (--requeue)."""
        from distlaunch.slurm.job import checkpoint_signal, job_options, resolve_job, srun_env
        from distlaunch.slurm.requeue import settle
        from distlaunch.slurm.srun import SaveSignal, run_srun

        opts = job_options(options)
        job = resolve_job(opts, os.environ)
        signal = job.save_signal
        result = run_srun(
            job.srun,
            out=out,
            env=srun_env(opts, job),  # --env values go through srun's environment, never its argv
            grace_period=opts.grace_period,
            save=SaveSignal(name=signal, saves_first_on_term=job.saves_on_signal) if signal else None,
            checkpoint=checkpoint_signal(signal),
        )
        return settle(result, job.requeue, os.environ)

    def script(
        self, opts: SlurmJobOptions, output: str | None, template: Path | None
    ) -> tuple[SlurmJob, str, SignalLead | None]:
        """The job as Slurm will run it, its batch script (what ``--dry-run`` prints), and how far ahead of its time
        limit it is warned (None: it is not requeued)."""
        from distlaunch.slurm.job import resolve_job
        from distlaunch.slurm.sbatch import batch_lead, render_script

        job = resolve_job(opts, {})  # the script asks for its own allocation: ignore the one we may be in
        lead = batch_lead(job, opts)
        return job, render_script(job, opts, output, template, lead), lead

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
        if found.restarts is not None:  # requeued by Slurm (its save-and-requeue, a preemption): still one job
            update["restarts"] = found.restarts
        update.update(_slurm_nodes(record, found.nodes, found.node_list))
        if state in ("succeeded", "stopped", "failed"):
            code = exit_code_of(found.state, found.exit_code)
            if code == REQUEUE_CODE:  # saved as asked, then ended for a requeue that was not to be: nothing failed
                update.update(state="stopped", error=None)
            update.update(exit_code=code, ended_at=time.time())
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

    def checkpoint(self, record: JobRecord, then: str, timeout: float) -> CheckpointSaved:
        """The batch script's ``distlaunch slurm run`` passes a signal on to every rank: the checkpoint signal (USR2:
        save, train on) or, for ``stop --checkpoint``, the save signal (USR1), as before a time limit: the ranks save
        one step and the job requeues itself (or, with --no-requeue, ends with 75); a job requeued so is cancelled
        while it waits: saved, then stopped. The step is the one every rank recorded in the job's folder."""
        from distlaunch.slurm.job import checkpoint_signal
        from distlaunch.slurm.jobstate import slurm_command
        from distlaunch.slurm.saves import answered_step, saved_steps

        if record.state != "running":
            raise UsageError(f"job {record.job_id} is {record.state}: no rank runs to save", "distlaunch stop stops it")
        save_signal = recorded_save_signal(record)
        if save_signal is None:
            raise UsageError(
                f"job {record.job_id} was submitted with --save-signal none: its ranks are never asked to save",
                f"distlaunch stop {record.job_id} stops it without a save",
            )
        signal_name = save_signal if then == "stop" else checkpoint_signal(save_signal)
        before = saved_steps(record.job_id)
        done = slurm_command(["scancel", "--batch", f"--signal={signal_name}", record.native_id or ""])
        if done.returncode:
            raise HostError(f"scancel --batch --signal={signal_name} {record.native_id} failed", done.stderr.strip())
        deadline = time.monotonic() + timeout
        now, step = record, None
        while time.monotonic() < deadline and now.state == "running":
            step = answered_step(before, saved_steps(record.job_id))
            if step is not None:
                break
            time.sleep(0.5)
            now = self.reread(record)
        if then == "stop":
            while time.monotonic() < deadline and now.state == "running":  # saved: the requeue (or the end) follows
                time.sleep(0.5)
                now = self.reread(record)
            if now.state == "pending":  # requeued after its save: it would start again and resume; it is to stop
                self.request_stop(record)
        step = answered_step(before, saved_steps(record.job_id))  # the last rank may have recorded it as it ended
        if step is None:
            raise NoAnswer(
                f"job {record.job_id} reported no checkpoint saved within {timeout:g}s",
                f"see 'distlaunch logs {record.job_id}'",
            )
        return CheckpointSaved(job_id=record.job_id, step=step, then=then)

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        if stderr:  # sbatch writes both streams to one file unless the template says otherwise
            raise UsageError(f"job {record.job_id} is a Slurm job: its stderr is in its output file", "drop --stderr")
        if not record.output:
            raise UsageError(f"job {record.job_id} writes per-node or per-task files", "look at its --output files")
        return Path(record.output)


def recorded_save_signal(record: JobRecord) -> str | None:
    """The signal the job's batch script saves on, as recorded when it was submitted (None: --save-signal none).
    A record written before distlaunch kept it has the default."""
    return record.plan.get("save_signal", DEFAULT_SAVE_SIGNAL)


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
    slurm_id: str,
    output: str | None,
    world_size: int,
    nodes: int,
    parallel: dict,
    command: list[str],
    backend: str,
    *,
    save_signal: str | None,
) -> None:
    """Record a submitted Slurm batch job (``slurm-<id>``): Slurm runs it, ``distlaunch jobs`` asks Slurm about it,
    ``distlaunch checkpoint`` sends it ``save_signal`` (or the checkpoint signal beside it)."""
    record = JobRecord(
        job_id=batch_job_id(slurm_id),
        backend="slurm",
        command=command,
        cwd=os.getcwd(),
        hosts=[f"({nodes} node{'s' * (nodes > 1)})"],
        world_size=world_size,
        state="pending",
        native_id=slurm_id,
        output=os.path.abspath(output) if output else None,
        # backend: the ranks' (auto: chosen on the nodes); save_signal: the batch script's --save-signal
        plan={"parallel": parallel, "backend": backend, "nodes": [], "save_signal": save_signal},
    )
    try:
        write_record(record)
    except OSError as exc:
        log.warning("cannot record Slurm job %s: %s", slurm_id, exc)
