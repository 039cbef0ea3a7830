"""A stand-in ``kubectl`` for a machine without a cluster: it records every argv and answers the few commands
distlaunch runs as kubectl does (same JSON shapes, messages and exit codes), from a cluster kept as JSON.

    $FAKE_KUBECTL_DIR/calls.jsonl    one JSON argv per call, in order
    $FAKE_KUBECTL_DIR/cluster.json   {"jobs": {ns/name: Job}, "services": {...}, "pods": {ns/name: Pod},
                                      "logs": {ns/pod: text}, "unreachable": [verb, ...]}

A verb listed under "unreachable" ("get", "logs", "delete") fails as kubectl does when the API server is down.

Tests move the cluster along with the helpers below (pods start, succeed, fail), as the Job controller would.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

STAMP = "2026-11-23T08:15:02Z"


def cluster_path(root: Path) -> Path:
    return root / "cluster.json"


def load(root: Path) -> dict:
    path = cluster_path(root)
    empty = {"jobs": {}, "services": {}, "pods": {}, "logs": {}, "unreachable": []}
    return {**empty, **json.loads(path.read_text())} if path.exists() else empty


def save(root: Path, cluster: dict) -> None:
    cluster_path(root).write_text(json.dumps(cluster, indent=1))


def calls(root: Path) -> list[list[str]]:
    path = root / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --- the cluster moving on (what the Job controller and the kubelet would do) ---


def start_pods(root: Path, name: str, namespace: str = "default", nodes: tuple[str, ...] = ("node-a", "node-b")):
    """Every index of the Job gets a running pod (on the given nodes, in order); the Job counts them active."""
    cluster = load(root)
    job = cluster["jobs"][f"{namespace}/{name}"]
    for index in range(job["spec"]["completions"]):
        _add_pod(cluster, job, index, "Running", nodes[index % len(nodes)])
    job["status"] = {
        "active": job["spec"]["completions"],
        "ready": job["spec"]["completions"],
        "startTime": STAMP,
        "terminating": 0,
        "uncountedTerminatedPods": {},
    }
    save(root, cluster)


def end_pod(root: Path, name: str, index: int, exit_code: int, namespace: str = "default", log: str = "") -> str:
    """The newest pod of ``index`` ends with ``exit_code``; returns its name (its log is set to ``log``)."""
    cluster = load(root)
    pod = max(
        (p for p in cluster["pods"].values() if _index(p) == index and p["metadata"]["labels"]["job-name"] == name),
        key=lambda p: p["metadata"]["creationTimestamp"],
    )
    pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": STAMP,
            "finishedAt": STAMP,
            "containerID": "containerd://ab12",
        }
    }
    pod["status"]["containerStatuses"][0]["ready"] = False
    if log:
        cluster["logs"][f"{namespace}/{pod['metadata']['name']}"] = log
    save(root, cluster)
    return pod["metadata"]["name"]


def set_log(root: Path, pod: str, text: str, namespace: str = "default") -> None:
    cluster = load(root)
    cluster["logs"][f"{namespace}/{pod}"] = text
    save(root, cluster)


def finish_job(root: Path, name: str, succeeded: bool, namespace: str = "default") -> None:
    """The Job's final conditions, as the Job controller writes them (Kubernetes 1.31)."""
    cluster = load(root)
    job = cluster["jobs"][f"{namespace}/{name}"]
    n = job["spec"]["completions"]
    if succeeded:
        conditions = [
            _condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
            _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
        ]
        job["status"] = {
            "completedIndexes": f"0-{n - 1}",
            "completionTime": STAMP,
            "conditions": conditions,
            "ready": 0,
            "startTime": STAMP,
            "succeeded": n,
            "terminating": 0,
            "uncountedTerminatedPods": {},
        }
    else:
        message = "Job has reached the specified backoff limit"
        conditions = [
            _condition("FailureTarget", "BackoffLimitExceeded", message),
            _condition("Failed", "BackoffLimitExceeded", message),
        ]
        job["status"] = {
            "conditions": conditions,
            "failed": 1,
            "ready": 0,
            "startTime": STAMP,
            "terminating": 0,
            "uncountedTerminatedPods": {},
        }
    save(root, cluster)


def _condition(kind: str, reason: str, message: str) -> dict:
    return {
        "lastProbeTime": STAMP,
        "lastTransitionTime": STAMP,
        "message": message,
        "reason": reason,
        "status": "True",
        "type": kind,
    }


def _index(pod: dict) -> int:
    return int(pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])


def _add_pod(cluster: dict, job: dict, index: int, phase: str, node: str) -> None:
    name, namespace, uid = job["metadata"]["name"], job["metadata"]["namespace"], job["metadata"]["uid"]
    pod_name = f"{name}-{index}-{'xk2vb' if index % 2 else 'q7d4n'}{len(cluster['pods'])}"
    labels = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-completion-index": str(index),
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
        **job["spec"]["template"]["metadata"]["labels"],
    }
    container = job["spec"]["template"]["spec"]["containers"][0]
    cluster["pods"][f"{namespace}/{pod_name}"] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "creationTimestamp": f"2026-11-23T08:15:{len(cluster['pods']):02d}Z",
            "generateName": f"{name}-{index}-",
            "labels": labels,
            "name": pod_name,
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "Job",
                    "name": name,
                    "uid": uid,
                }
            ],
            "resourceVersion": "48213",
            "uid": f"7c1e0f3a-0000-4000-8000-{len(cluster['pods']):012d}",
        },
        "spec": {**job["spec"]["template"]["spec"], "hostname": f"{name}-{index}", "nodeName": node},
        "status": {
            "conditions": [{"lastTransitionTime": STAMP, "status": "True", "type": "Ready"}],
            "containerStatuses": [
                {
                    "containerID": "containerd://ab12",
                    "image": container["image"],
                    "imageID": container["image"] + "@sha256:0f3a",
                    "name": container["name"],
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": STAMP}},
                }
            ],
            "hostIP": "10.0.0.11",
            "phase": phase,
            "podIP": f"10.244.1.{10 + index}",
            "qosClass": "BestEffort",
            "startTime": STAMP,
        },
    }


# --- kubectl itself ---


def main(argv: list[str]) -> int:
    root = Path(os.environ["FAKE_KUBECTL_DIR"])
    with open(root / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    args, namespace = _namespace(argv)
    cluster = load(root)
    if args[:1] and args[0] in cluster["unreachable"]:
        return _fail(
            "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?"
        )
    if args[:3] == ["apply", "-f", "-"]:
        return _apply(root, cluster, sys.stdin.read())
    if args[:2] == ["get", "job"] and args[3:] == ["-o", "json"]:
        job = cluster["jobs"].get(f"{namespace}/{args[2]}")
        if job is None:
            return _fail(f'Error from server (NotFound): jobs.batch "{args[2]}" not found')
        return _print(job)
    if args[:3] == ["get", "pods", "-l"] and args[4:] == ["-o", "json"]:
        key, _, value = args[3].partition("=")
        items = [
            p
            for p in cluster["pods"].values()
            if p["metadata"]["namespace"] == namespace and p["metadata"]["labels"].get(key) == value
        ]
        return _print({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}})
    if args[:1] == ["logs"]:
        pod = next(a for a in args[1:] if not a.startswith("-"))
        if f"{namespace}/{pod}" not in cluster["pods"]:
            return _fail(f'error: error from server (NotFound): pods "{pod}" not found in namespace "{namespace}"')
        lines = cluster["logs"].get(f"{namespace}/{pod}", "").splitlines()
        tail = next((int(a.split("=")[1]) for a in args if a.startswith("--tail=")), -1)
        sys.stdout.write("".join(f"{line}\n" for line in (lines if tail < 0 else lines[len(lines) - tail :])))
        return 0
    if args[:1] == ["delete"]:
        return _delete(root, cluster, namespace, [a for a in args[1:] if not a.startswith("-")])
    return _fail(f'error: unknown command "{" ".join(args)}" for "kubectl"')


def _namespace(argv: list[str]) -> tuple[list[str], str]:
    args, namespace, i = [], "default", 0
    while i < len(argv):
        if argv[i] in ("-n", "--namespace"):
            namespace, i = argv[i + 1], i + 2
            continue
        args.append(argv[i])
        i += 1
    return args, namespace


def _apply(root: Path, cluster: dict, text: str) -> int:
    for obj in yaml.safe_load_all(text):
        meta = obj["metadata"]
        namespace = meta.get("namespace", "default")
        key = f"{namespace}/{meta['name']}"
        stored = {
            **obj,
            "metadata": {
                **meta,
                "namespace": namespace,
                "uid": f"3f9a2c1e-0000-4000-8000-{len(key):012d}",
                "creationTimestamp": STAMP,
                "resourceVersion": "48177",
                "generation": 1,
            },
        }
        kind = "jobs" if obj["kind"] == "Job" else "services"
        if kind == "jobs":
            stored["status"] = {}
        created = key not in cluster[kind]
        cluster[kind][key] = stored
        print(f"{'job.batch' if kind == 'jobs' else 'service'}/{meta['name']} {'created' if created else 'unchanged'}")
    save(root, cluster)
    return 0


def _delete(root: Path, cluster: dict, namespace: str, targets: list[str]) -> int:
    code = 0
    for target in targets:
        kind, _, name = target.partition("/")
        store, shown = ("jobs", "job.batch") if kind == "job" else ("services", "service")
        if cluster[store].pop(f"{namespace}/{name}", None) is None:
            sys.stderr.write(
                f'Error from server (NotFound): {"jobs.batch" if kind == "job" else "services"} "{name}" not found\n'
            )
            code = 1
            continue
        if kind == "job":  # foreground cascade: the pods are gone before the Job
            cluster["pods"] = {
                k: p for k, p in cluster["pods"].items() if p["metadata"]["labels"].get("job-name") != name
            }
        print(f'{shown} "{name}" deleted')
    save(root, cluster)
    return code


def _print(obj: dict) -> int:
    print(json.dumps(obj, indent=4))
    return 0


def _fail(message: str) -> int:
    sys.stderr.write(message + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
