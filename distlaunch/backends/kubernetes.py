"""Kubernetes: ``distlaunch k8s submit`` applies an Indexed Job whose pods run the per-node mode; the cluster runs
it. Its state comes from kubectl get job/pods, ``stop`` is kubectl delete, its output is kubectl logs of the pod
that runs a rank.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel

from distlaunch.backends.base import Backend, CheckpointSaved, LastKnown, Submission, remember
from distlaunch.backends.output import keep_ranks
from distlaunch.errors import HostError, UsageError
from distlaunch.jobs.store import FINAL_STATES, STOP_FILE, JobRecord, job_folder, write_record

if TYPE_CHECKING:
    from distlaunch.contract.report import StacksSnapshot
    from distlaunch.k8s.manifest import K8sJobOptions

log = logging.getLogger("distlaunch")


class Applied(BaseModel):
    """What ``kubectl apply`` made of a submitted manifest: its exit code, and the job's record once the cluster
    took it (None: kubectl refused it)."""

    exit_code: int
    job_id: str | None = None


class Kubernetes(Backend):
    """Indexed Jobs submitted by ``distlaunch k8s submit``: rank R runs in the pod of index R // nproc_per_node."""

    name = "k8s"
    records = ("k8s",)

    def submission(self, options: Mapping[str, Any]) -> Submission[K8sJobOptions]:
        """The headless Service and the Indexed Job for ``k8s manifest|submit``'s options (an option left unset,
        None, takes its default): YAML for ``kubectl apply -f``, and the same objects as JSON."""
        from distlaunch.k8s.manifest import K8sJobOptions, manifest
        from distlaunch.k8s.yaml import dump_all

        opts = K8sJobOptions(**{name: value for name, value in options.items() if value is not None})
        objects = manifest(opts)
        return Submission(request=opts, text=dump_all(objects), data=objects)

    def submit(self, submission: Submission[K8sJobOptions], out: TextIO, command: list[str]) -> Applied:
        """Apply the manifest with ``kubectl apply -f -`` (its output passes through) and record the job."""
        from distlaunch.k8s.submit import kubectl_apply

        code = kubectl_apply(submission.text)
        if code:
            return Applied(exit_code=code)
        opts = submission.request
        backend = "nccl" if opts.gpus_per_node else "gloo"  # what a pod's ranks choose: its GPUs, or none
        job_id = record_k8s_job(opts.name, opts.namespace, opts.nodes, opts.nproc_per_node, command, backend)
        return Applied(exit_code=0, job_id=job_id)

    def stacks(self, record: JobRecord, timeout: float) -> StacksSnapshot:
        raise UsageError(
            f"job {record.job_id} is a k8s job: distlaunch stacks reaches only jobs of run and train",
            "run py-spy dump --pid PID in its pods (kubectl exec POD -- ...), or submit with --hang-timeout",
        )

    def current(self, record: JobRecord) -> JobRecord:
        if record.final or record.native_id is None:
            return record
        from distlaunch.k8s.jobstate import get_job, get_pods, job_state, newest_pods, pod_state

        job = get_job(record.native_id, record.namespace)
        if job is None:  # deleted: by 'distlaunch stop' (its record says so already), or by someone else
            stopped = (job_folder(record.job_id) / STOP_FILE).exists()
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
        return self._final(now, state, code, error) if state in FINAL_STATES else remember(record, now)

    def _final(self, record: JobRecord, state: str, code: int | None, error: str | None) -> JobRecord:
        now = record.model_copy(update={"state": state, "exit_code": code, "error": error, "ended_at": time.time()})
        write_record(now)  # final: later reads need no kubectl
        return now

    def checkpoint(self, record: JobRecord, then: str, timeout: float) -> CheckpointSaved:
        """Each pod's distlaunch (the container's first process) saves on its save signal, then stops (exit 75),
        as a pod's SIGTERM saves when the save fits; distlaunch does not reach into the pods for it."""
        raise UsageError(
            f"job {record.job_id} is a Kubernetes job: distlaunch does not signal its pods",
            "in every pod, kubectl exec POD -- kill -USR1 1 asks its distlaunch for a checkpoint, then a stop (exit 75); "
            f"distlaunch stop {record.job_id} deletes the pods, whose SIGTERM saves first when the save fits",
        )

    def request_stop(self, record: JobRecord) -> None:
        from distlaunch.k8s.kubectl import kubectl, with_namespace

        name = record.native_id or ""
        (job_folder(record.job_id) / STOP_FILE).write_text(f"{time.time()}\n", encoding="utf-8")
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
        keep = keep_ranks(ranks)
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


def k8s_job_id(name: str, namespace: str | None) -> str:
    """``k8s-NAME``, or ``k8s-NAME.NAMESPACE`` (neither holds a dot, so the id reads back unambiguously)."""
    return f"k8s-{name}" + (f".{namespace}" if namespace else "")


def record_k8s_job(
    name: str, namespace: str | None, nodes: int, nproc_per_node: int, command: list[str], backend: str
) -> str:
    """Record a submitted Kubernetes Job; ``distlaunch jobs`` asks kubectl about it. Returns its id.

    Kubernetes knows a Job by namespace and name: submitting that name again is the same job, so its record
    (and a stop request left by an earlier one) is replaced."""
    record = JobRecord(
        job_id=k8s_job_id(name, namespace),
        backend="k8s",
        command=command,
        cwd=os.getcwd(),
        hosts=[f"({nodes} pod{'s' * (nodes > 1)})"],
        world_size=nodes * nproc_per_node,
        state="pending",
        native_id=name,
        namespace=namespace,
        plan={
            "parallel": {"dp": nodes * nproc_per_node},
            "backend": backend,
            "nodes": [],
            "nnodes": nodes,
            "nproc_per_node": nproc_per_node,
        },
    )
    try:
        (job_folder(record.job_id) / STOP_FILE).unlink(missing_ok=True)
        write_record(record)
    except OSError as exc:
        log.warning("cannot record Kubernetes job %s: %s", name, exc)
    return record.job_id
