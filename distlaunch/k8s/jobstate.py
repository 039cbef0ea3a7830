"""A submitted Kubernetes Job as the job registry sees it: state from the Job's status, pods by index.

Pods of an Indexed Job carry the label ``batch.kubernetes.io/job-completion-index`` (Kubernetes 1.28+;
older ones only the annotation of that name) and ``job-name``. A failed pod is replaced by a new one
with the same index, so each index's newest pod is the one that counts.
"""

from __future__ import annotations

from distlaunch.k8s.kubectl import NotFound, kubectl_json, with_namespace

INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def get_job(name: str, namespace: str | None) -> dict | None:
    """The Job object (``kubectl get job NAME -o json``), or None when the cluster has no such Job."""
    try:
        return kubectl_json(with_namespace(["get", "job", name], namespace))
    except NotFound:
        return None


def get_pods(name: str, namespace: str | None) -> list[dict]:
    """The Job's pods (``kubectl get pods -l job-name=NAME -o json``)."""
    return kubectl_json(with_namespace(["get", "pods", "-l", f"job-name={name}"], namespace)).get("items", [])


def pod_index(pod: dict) -> int | None:
    meta = pod.get("metadata", {})
    value = meta.get("labels", {}).get(INDEX_KEY) or meta.get("annotations", {}).get(INDEX_KEY)
    return int(value) if value is not None and str(value).isdigit() else None


def newest_pods(pods: list[dict]) -> dict[int, dict]:
    """Each completion index's newest pod."""
    newest: dict[int, dict] = {}
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp", "")):
        index = pod_index(pod)
        if index is not None:
            newest[index] = pod
    return newest


def pod_exit_code(pod: dict) -> int | None:
    """The exit code of the pod's container once it has ended."""
    for status in pod.get("status", {}).get("containerStatuses", []):
        ended = status.get("state", {}).get("terminated")
        if ended is not None:
            return int(ended.get("exitCode", 1))
    return None


def pod_state(pod: dict) -> str:
    """'Running on node-a', 'Failed (exit 3) on node-a', 'Pending'."""
    phase = pod.get("status", {}).get("phase", "Unknown")
    code = pod_exit_code(pod)
    node = pod.get("spec", {}).get("nodeName")
    return (
        phase + (f" (exit {code})" if code is not None and phase == "Failed" else "") + (f" on {node}" if node else "")
    )


def job_state(job: dict, pods: list[dict]) -> tuple[str, int | None, str | None]:
    """(registry state, exit code, error) from the Job's status conditions and counts, and its pods."""
    status = job.get("status", {})
    conditions = {c.get("type"): c for c in status.get("conditions", []) if c.get("status") == "True"}
    if "Complete" in conditions:
        return "succeeded", 0, None
    if "Failed" in conditions:
        failed = conditions["Failed"]
        codes = [c for c in (pod_exit_code(p) for p in pods if p.get("status", {}).get("phase") == "Failed") if c]
        why = ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x)
        return "failed", codes[0] if codes else 1, f"Kubernetes: {why or 'the Job failed'}"
    running = any(p.get("status", {}).get("phase") == "Running" for p in pods)
    return ("running" if status.get("active") and running else "pending"), None, None
