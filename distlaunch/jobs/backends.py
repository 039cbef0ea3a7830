"""What each backend does for a recorded job: say what it is doing now, stop it, read its output.

A job started by ``run``/``train`` (locally or over SSH) is driven by its launcher process, in a terminal or
as a detached supervisor: the record's owner. A Slurm batch job is Slurm's: its state comes from
scontrol/sacct, ``stop`` is scancel, its output is the job's output file. A Kubernetes Job is the cluster's:
kubectl get job/pods, kubectl delete, kubectl logs of the pod that runs a rank. A backend is one class here.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from distlaunch.errors import DistlaunchError, HostError, NoAnswer, UsageError
from distlaunch.files import open_regular
from distlaunch.jobs.store import (
    FINAL_STATES,
    STOP_FILE,
    JobRecord,
    Unreadable,
    find_record,
    free_space,
    jobs_dir,
    list_records,
    read_record,
    write_record,
)

POLL_S = 0.2
WRITER_WAIT_S = 10.0  # logs --follow: how long a job that has ended may still be writing its report
OUTPUT_FILE = "output.log"  # a detached job's terminal output, in its folder
ERRORS_FILE = "errors.log"  # the same job's stderr lines and distlaunch's notices alone
LAUNCH_FILE = "launch.json"  # a detached job's plan and options, for its supervisor: only detached jobs have one


class JobBackend(Protocol):
    def current(self, record: JobRecord) -> JobRecord:
        """The record as the job stands now."""
        ...

    def request_stop(self, record: JobRecord) -> None:
        """Ask the job to stop as Ctrl-C would; the record says when it has."""
        ...

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        """The job's output lines (only ``ranks``' when given, the last ``tail``); ``follow``: until it ends,
        and then ``on_end`` hears of the record as it ended (where the backend can tell)."""
        ...


class _FileOutput(ABC):
    """Backends whose job writes its output to one file here."""

    @abstractmethod
    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        """The file that holds the job's output (or its stderr alone)."""

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        return _file_lines(record, self.output(record, stderr), follow, _keep(ranks), tail, on_end)


class LauncherJobs(_FileOutput):
    """Jobs driven by a distlaunch launcher process (local and SSH backends, foreground or detached)."""

    def current(self, record: JobRecord) -> JobRecord:
        # "lost": the record says running but its launcher is gone (SIGKILL, reboot); its agents took the ranks.
        if record.state == "running" and record.owner is not None and not record.owner.alive():
            free_space(record.job_id)  # the room its last record would have taken: nobody writes that now
            return record.model_copy(update={"state": "lost"})
        return record

    def request_stop(self, record: JobRecord) -> None:
        owner = record.owner
        if owner is None or owner.hostname != os.uname().nodename:
            where = owner.hostname if owner else "an unknown host"
            raise UsageError(f"job {record.job_id} is supervised on {where}", f"run 'distlaunch stop' on {where}")
        (jobs_dir() / record.job_id / STOP_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
        if owner.alive():  # pid and start time both match: never a stranger that reused the pid
            os.kill(owner.pid, signal.SIGTERM)  # the launcher stops every rank: SIGTERM, grace period, SIGKILL

    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        folder = jobs_dir() / record.job_id
        path = folder / (ERRORS_FILE if stderr else OUTPUT_FILE)
        if not os.path.lexists(path) and not os.path.lexists(folder / LAUNCH_FILE):
            hint = f"its ranks' logs are in {record.log_dir}" if record.log_dir else "start jobs with --detach"
            raise UsageError(f"job {record.job_id} ran in a terminal: distlaunch kept no output of it", hint)
        return path


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


class SlurmJobs(_FileOutput):
    """Batch jobs submitted by ``distlaunch slurm sbatch``: scontrol/sacct, scancel, the job's output file."""

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
        return _remember(record, record.model_copy(update=update))

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


def _remember(record: JobRecord, now: JobRecord) -> JobRecord:
    """Keep what the scheduler said last (state, nodes) in the record when it changed: while the scheduler cannot
    be asked, that is the state shown, marked as last known."""
    if (now.state, now.hosts, now.plan) == (record.state, record.hosts, record.plan):
        return now
    on_disk = read_record(jobs_dir() / record.job_id)
    if isinstance(on_disk, JobRecord) and not on_disk.final:  # never over a final record written meanwhile
        with contextlib.suppress(OSError):  # a state directory that cannot be written costs the memory only
            write_record(now)
    return now


class K8sJobs:
    """Indexed Jobs submitted by ``distlaunch k8s submit``: rank R runs in the pod of index R // nproc_per_node."""

    def current(self, record: JobRecord) -> JobRecord:
        if record.final or record.native_id is None:
            return record
        from distlaunch.k8s.jobstate import get_job, get_pods, job_state, newest_pods, pod_state

        job = get_job(record.native_id, record.namespace)
        if job is None:  # deleted: by 'distlaunch stop' (its record says so already), or by someone else
            stopped = (jobs_dir() / record.job_id / STOP_FILE).exists()
            return self._final(record, "stopped" if stopped else "lost", None, None if stopped else _K8S_GONE)
        pods = get_pods(record.native_id, record.namespace)
        state, code, error = job_state(job, pods)
        nproc = int(record.plan.get("nproc_per_node", 1))
        nodes = [
            {"host": pod["metadata"]["name"], "node_rank": index, "state": pod_state(pod),
             "ranks": [{"rank": index * nproc + k} for k in range(nproc)]}
            for index, pod in sorted(newest_pods(pods).items())
        ]  # fmt: skip
        now = record.model_copy(
            update={
                "hosts": [n["host"] for n in nodes] or record.hosts,
                "plan": {**record.plan, "nodes": nodes},
                "state": state,
                "error": error,
            }
        )
        return self._final(now, state, code, error) if state in FINAL_STATES else _remember(record, now)

    def _final(self, record: JobRecord, state: str, code: int | None, error: str | None) -> JobRecord:
        now = record.model_copy(update={"state": state, "exit_code": code, "error": error, "ended_at": time.time()})
        write_record(now)  # final: later reads need no kubectl
        return now

    def request_stop(self, record: JobRecord) -> None:
        from distlaunch.k8s.kubectl import kubectl, with_namespace

        name = record.native_id or ""
        (jobs_dir() / record.job_id / STOP_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
        # Foreground cascade: the pods (SIGTERM, then each pod's distlaunch stops its ranks) go before the Job,
        # and --wait returns once the Job is gone; the Service goes with it.
        kubectl(with_namespace(["delete", f"job/{name}", f"service/{name}", "--cascade=foreground", "--wait=true"],
                               record.namespace), timeout=STOP_TIMEOUT_S)  # fmt: skip
        self._final(record, "stopped", None, None)

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        from distlaunch.k8s.kubectl import kubectl, with_namespace

        if stderr:
            raise UsageError(
                f"job {record.job_id} is a Kubernetes job: a pod's log holds both streams", "drop --stderr"
            )
        if isinstance(record, LastKnown):  # the pods are unknown: say why rather than guess from the last ones
            raise HostError(record.unknown, "check kubectl's context and access")
        nproc, nnodes = int(record.plan.get("nproc_per_node", 1)), int(record.plan.get("nnodes", 1))
        indices = sorted({r // nproc for r in ranks}) if ranks else list(range(nnodes))
        if follow and len(indices) > 1:
            raise UsageError(
                f"--follow follows one pod; job {record.job_id} has {nnodes}", "give --rank for a rank of that pod"
            )
        # The pods as current() just read them (each index's newest): no second kubectl get pods.
        pods = {node["node_rank"]: node["host"] for node in record.plan.get("nodes", [])}
        missing = [i for i in indices if i not in pods]
        if missing:
            raise UsageError(
                f"job {record.job_id} has no pod of index {missing[0]} (ranks {missing[0] * nproc}-"
                f"{(missing[0] + 1) * nproc - 1})",
                f"see 'distlaunch status {record.job_id}'",
            )
        names = [pods[i] for i in indices]
        keep = _keep(ranks)
        if follow:
            args = with_namespace(["logs", "-f", names[0], *([f"--tail={tail}"] if tail is not None else [])],
                                  record.namespace)  # fmt: skip
            yield from (line for line in _follow_kubectl(args) if keep(line))
            return
        kept = [
            line for name in names for line in kubectl(with_namespace(["logs", name], record.namespace)).split("\n")
        ]
        kept = [line for line in kept if line and keep(line)]
        yield from kept if tail is None else kept[len(kept) - tail :] if tail else []


_K8S_GONE = "the cluster no longer has this Job (deleted outside distlaunch)"
STOP_TIMEOUT_S = 300.0  # kubectl delete --wait: every pod's grace period (30 s by default) and then some


def _follow_kubectl(args: list[str]) -> Iterator[str]:
    """``kubectl logs -f``'s lines as they come; its failure as one line once it ends."""
    from distlaunch.k8s.kubectl import command_line, kubectl_path

    proc = subprocess.Popen(
        [kubectl_path(args), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
    )
    try:
        for line in proc.stdout:
            yield line.rstrip("\n")
        proc.wait()
        if proc.returncode:
            said = next((line for line in proc.stderr.read().splitlines() if line.strip()), f"exit {proc.returncode}")
            raise HostError(f"'{command_line(args)}' failed: {said.strip()}", "check kubectl's context and access")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


BACKENDS: dict[str, JobBackend] = {
    "local": LauncherJobs(),
    "ssh": LauncherJobs(),
    "slurm": SlurmJobs(),
    "k8s": K8sJobs(),
}


def backend_of(record: JobRecord) -> JobBackend:
    return BACKENDS.get(record.backend, LauncherJobs())


class LastKnown(JobRecord):
    """A job's record as last known, when its scheduler cannot be asked now: ``unknown`` says why. Its state is
    the last one seen, not necessarily the job's now (``jobs`` marks it, ``jobs --json`` carries ``unknown``)."""

    unknown: str


def last_known(record: JobRecord, problem: DistlaunchError) -> LastKnown:
    return LastKnown(**record.model_dump(), unknown=problem.message)


def list_jobs() -> list[JobRecord | Unreadable]:
    """Every recorded job as it stands now, newest first."""
    out_of_reach: dict[str, DistlaunchError] = {}
    return [r if isinstance(r, Unreadable) else _current_or_last(r, out_of_reach) for r in list_records()]


def _current_or_last(record: JobRecord, out_of_reach: dict[str, DistlaunchError]) -> JobRecord:
    # A scheduler out of reach (no kubectl here, a cluster down) costs one job its news, not the listing:
    # its last known state stands, marked ('distlaunch status' says why). A slurmctld that cannot be reached
    # is asked once per listing, not once per job.
    if record.backend in out_of_reach and not record.final:
        return last_known(record, out_of_reach[record.backend])
    try:
        return backend_of(record).current(record)
    except DistlaunchError as exc:
        from distlaunch.slurm.jobstate import SlurmUnanswered

        if isinstance(exc, SlurmUnanswered):
            out_of_reach[record.backend] = exc
        return last_known(record, exc)


def find_job(prefix: str, last_known_ok: bool = False) -> JobRecord:
    """The job with this id or unique id prefix, as it stands now.

    When its scheduler cannot be reached (HostError) that error is raised, or with ``last_known_ok`` the record
    as last known is returned (a ``LastKnown``): ``stop`` still tries the scheduler's own stop command."""
    record = find_record(prefix)
    try:
        return backend_of(record).current(record)
    except HostError as exc:
        if not last_known_ok:
            raise
        return last_known(record, exc)


def stop_job(record: JobRecord, timeout: float) -> JobRecord:
    """Stop a running job and wait until its record says how it ended."""
    if record.final:
        raise UsageError(f"job {record.job_id} is {record.state}, not running", "nothing to stop")
    if isinstance(record, LastKnown):  # its scheduler could not be asked: its own stop command may still work
        record = JobRecord(**record.model_dump(exclude={"unknown"}))
    backend = backend_of(record)
    backend.request_stop(record)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _reread(record)
        if now.final:
            return now
        time.sleep(POLL_S)
    raise NoAnswer(
        f"job {record.job_id} did not confirm its end within {timeout:g}s",
        f"its ranks may still be in their --grace-period: see 'distlaunch status {record.job_id}', "
        "or give a longer --timeout",
    )


def _reread(record: JobRecord) -> JobRecord:
    """The job as it stands now; while its scheduler cannot be asked, as last known (a wait goes on)."""
    raw = read_record(jobs_dir() / record.job_id)
    raw = raw if isinstance(raw, JobRecord) else record
    try:
        return backend_of(raw).current(raw)
    except HostError as exc:
        return last_known(raw, exc)


class Note(str):
    """A line for the reader about the output itself (it was truncated), not a line of the job's output."""


def rank_of(line: str) -> int | None:
    """The rank a printed output line belongs to ('[rank 3] …', '[host rank 3] …' or srun's '3: …')."""
    if line.startswith("["):
        head = line[1 : line.find("]")].split()
        return int(head[-1]) if len(head) >= 2 and head[-2] == "rank" and head[-1].isdigit() else None
    label, colon, _ = line.partition(":")
    return int(label.strip()) if colon and label.strip().isdigit() else None


def read_lines(
    record: JobRecord,
    follow: bool,
    ranks: set[int],
    tail: int | None = None,
    stderr: bool = False,
    on_end: Callable[[JobRecord], None] | None = None,
) -> Iterator[str]:
    """The job's output lines (only ``ranks``' lines when given; the last ``tail`` of them); with ``follow``,
    then every new one until the job is no longer running (``on_end`` then hears how it ended)."""
    outside = sorted(r for r in ranks if not 0 <= r < record.world_size)
    if outside:  # a rank the job does not have would print nothing, as if it had said nothing
        have = "0" if record.world_size == 1 else f"0-{record.world_size - 1}"
        raise UsageError(
            f"job {record.job_id} has no rank {outside[0]}: its ranks are {have}",
            f"give --rank between 0 and {record.world_size - 1}",
        )
    return backend_of(record).lines(record, follow, ranks, tail, stderr, on_end)


def _keep(ranks: set[int]) -> Callable[[str], bool]:
    return lambda line: not ranks or rank_of(line) in ranks


def _file_lines(
    record: JobRecord,
    path: Path,
    follow: bool,
    keep: Callable[[str], bool],
    tail: int | None,
    on_end: Callable[[JobRecord], None] | None = None,
) -> Iterator[str]:
    end: JobRecord | None = None
    final_at: float | None = None

    def ended() -> bool:
        # Final, and its owner done writing: a detached job's supervisor records the end first, then prints
        # the failure report into the output (waited for at most WRITER_WAIT_S, should it hang).
        nonlocal end, final_at
        now = _reread(record)
        if now.final and final_at is None:
            final_at = time.monotonic()
        owner = now.owner if now.owner is not None and now.owner.hostname == os.uname().nodename else None
        writing = owner is not None and owner.alive() and time.monotonic() - (final_at or 0) < WRITER_WAIT_S
        end = now if now.final and not writing else None
        return end is not None

    if not path.exists():
        if record.final:  # nothing more will come: --follow would print nothing and wait for nothing
            raise UsageError(
                f"job {record.job_id} has ended, and its output file {path} is missing (removed since)",
                f"'distlaunch status {record.job_id}' says how it ended",
            )
        if not follow:
            raise UsageError(f"job {record.job_id} has no output yet: {path} does not exist", "try again later")
        while not path.exists() and not ended():
            time.sleep(POLL_S)
        if not path.exists():
            if on_end is not None and end is not None:
                on_end(end)
            return
    try:
        f = open(open_regular(path), encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by the with below
    except OSError as exc:  # a folder, a pipe, a symlink loop, no permission: not a file to read lines from
        raise UsageError(
            f"cannot read the output of job {record.job_id}: {path}: {(exc.strerror or str(exc)).lower()}",
            f"move it aside: the job wrote its output to a file there; 'distlaunch status {record.job_id}' still works",
        ) from None
    with f:
        # line by line, keeping at most the last ``tail`` kept lines: a job's output can be many GB
        pending, last = "", collections.deque(maxlen=tail) if tail is not None else None
        for line in f:
            if not line.endswith("\n"):  # the line the job is writing now: completed by what follows
                pending = line
                break
            if keep(line := line[:-1]):
                if last is None:
                    yield line
                else:
                    last.append(line)
        yield from last or ()
        while follow:
            chunk = f.read()
            if not chunk and os.fstat(f.fileno()).st_size < f.buffer.tell():
                # emptied under us (to free its disk, as logrotate's copytruncate does): the writer appends from
                # the new end, so read again from the start, as tail -F does; what was not yet read is gone
                yield Note(f"{path} was truncated; following it from its new start")
                pending = ""
                f.seek(0)
                continue
            if not chunk:
                if not ended():
                    time.sleep(POLL_S)
                    continue
                chunk, follow = f.read(), False  # what the job wrote between the last read and its end
            *lines, pending = (pending + chunk).split("\n")
            yield from (line for line in lines if keep(line))
        if pending and keep(pending):
            yield pending
    if on_end is not None and end is not None:
        on_end(end)
