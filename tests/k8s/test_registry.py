"""Kubernetes jobs in the job registry: ``k8s submit`` records the job; ``jobs``, ``status``, ``logs`` and ``stop``
answer through kubectl. No cluster here: a stand-in kubectl (fake_kubectl.py) records every argv and answers
with kubectl's own JSON, messages and exit codes, and the tests move its cluster along."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import invoke
from tests.k8s.fake_kubectl import calls, end_pod, finish_job, load, save, set_log, start_pods

FAKE = Path(__file__).with_name("fake_kubectl.py")
SUBMIT = ["k8s", "submit", "--image", "registry.example/gpt:1", "--nodes", "2", "--nproc-per-node", "2"]
GET_JOB = ["get", "job", "gpt", "-o", "json"]
GET_PODS = ["get", "pods", "-l", "job-name=gpt", "-o", "json"]


class Kube:
    """The stand-in cluster and the environment the CLI runs in."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "cluster"
        self.root.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        kubectl = bin_dir / "kubectl"
        kubectl.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n")
        kubectl.chmod(0o755)
        self.env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_KUBECTL_DIR": str(self.root),
            "DISTLAUNCH_STATE_DIR": str(tmp_path / "state"),
        }

    def cli(self, *args: str, **env: str):
        return invoke(list(args), env={**self.env, **env})

    def json(self, *args: str) -> dict | list:
        r = self.cli(*args, "--json")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)

    def calls_since(self, mark: int) -> list[list[str]]:
        return calls(self.root)[mark:]

    def submit(self, *extra: str) -> None:
        r = self.cli(*SUBMIT, "--name", "gpt", *extra, "--", "train.py", "--lr", "3e-4")
        assert r.exit_code == 0, r.stderr


@pytest.fixture
def kube(tmp_path):
    return Kube(tmp_path)


def test_a_submitted_job_is_recorded_and_its_state_follows_the_job_status(kube):
    r = kube.cli(*SUBMIT, "--name", "gpt", "--", "train.py")
    assert r.exit_code == 0, r.stderr
    assert "recorded as job k8s-gpt: distlaunch status k8s-gpt" in r.stderr
    assert calls(kube.root) == [["apply", "-f", "-"]]

    [listed] = kube.json("jobs")
    assert (listed["job_id"], listed["backend"], listed["state"], listed["world_size"]) == (
        "k8s-gpt",
        "k8s",
        "pending",
        4,
    )
    assert listed["native_id"] == "gpt" and listed["hosts"] == ["(2 pods)"]
    assert kube.calls_since(1) == [GET_JOB, GET_PODS]

    start_pods(kube.root, "gpt")
    running = kube.json("status", "gpt")  # the Job's name finds its record, as Slurm's id does
    assert running["state"] == "running" and running["hosts"][0].startswith("gpt-0-")
    shown = kube.cli("status", "k8s-gpt").stdout
    assert "k8s job    job/gpt" in shown and "Running on node-a" in shown and "Running on node-b" in shown

    for index in (0, 1):
        end_pod(kube.root, "gpt", index, 0)
    finish_job(kube.root, "gpt", succeeded=True)
    done = kube.json("status", "k8s-gpt")
    assert (done["state"], done["exit_code"]) == ("succeeded", 0)
    assert "Succeeded on node-a" in kube.cli("status", "k8s-gpt").stdout
    mark = len(calls(kube.root))
    assert kube.json("jobs")[0]["state"] == "succeeded"
    assert kube.calls_since(mark) == []  # a finished job's record is final: no more kubectl


def test_a_failed_job_takes_its_failed_pod_exit_code(kube):
    kube.submit()
    start_pods(kube.root, "gpt")
    end_pod(kube.root, "gpt", 1, 3)
    finish_job(kube.root, "gpt", succeeded=False)
    failed = kube.json("status", "k8s-gpt")
    assert (failed["state"], failed["exit_code"]) == ("failed", 3)
    assert failed["error"] == "Kubernetes: BackoffLimitExceeded: Job has reached the specified backoff limit"
    assert "Failed (exit 3) on node-b" in kube.cli("status", "k8s-gpt").stdout


def test_logs_of_a_rank_come_from_the_pod_of_its_index(kube):
    kube.submit()
    start_pods(kube.root, "gpt")
    pods = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: n for n, p in
            ((p["metadata"]["name"], p) for p in load(kube.root)["pods"].values())}  # fmt: skip
    set_log(kube.root, pods["0"], "[rank 0] step 1\n[rank 1] step 1\n[rank 1] step 2\n")
    set_log(kube.root, pods["1"], "[rank 2] step 1\n[rank 3] step 1\ndistlaunch: a notice\n")

    mark = len(calls(kube.root))
    r = kube.cli("logs", "k8s-gpt", "--rank", "3")
    assert (r.exit_code, r.stdout) == (0, "[rank 3] step 1\n"), r.stderr
    assert kube.calls_since(mark) == [GET_JOB, GET_PODS, ["logs", pods["1"]]]

    every = kube.cli("logs", "k8s-gpt", "--tail", "3").stdout.splitlines()
    assert every == ["[rank 2] step 1", "[rank 3] step 1", "distlaunch: a notice"]

    mark = len(calls(kube.root))
    followed = kube.cli("logs", "k8s-gpt", "--rank", "1", "--follow", "--tail", "2")
    assert followed.stdout == "[rank 1] step 1\n[rank 1] step 2\n", followed.stderr
    assert kube.calls_since(mark) == [GET_JOB, GET_PODS, ["logs", "-f", pods["0"], "--tail=2"]]

    cases = {
        ("--follow",): "--follow follows one pod; job k8s-gpt has 2",
        ("--stderr",): "a pod's log holds both streams",
        ("--rank", "9"): "job k8s-gpt has no rank 9",
    }
    for args, message in cases.items():
        r = kube.cli("logs", "k8s-gpt", *args)
        assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)


def test_stop_deletes_the_job_and_its_pods_and_waits(kube):
    kube.submit()
    start_pods(kube.root, "gpt")
    mark = len(calls(kube.root))
    stopped = kube.json("stop", "gpt")
    assert stopped["state"] == "stopped"
    delete = ["delete", "job/gpt", "service/gpt", "--cascade=foreground", "--wait=true"]
    assert kube.calls_since(mark) == [GET_JOB, GET_PODS, delete]
    cluster = load(kube.root)
    assert cluster["jobs"] == cluster["pods"] == cluster["services"] == {}
    assert kube.json("jobs")[0]["state"] == "stopped"
    again = kube.cli("stop", "gpt")
    assert again.exit_code == 2 and "is stopped, not running" in again.stderr


def test_a_namespaced_job_is_asked_about_in_its_namespace_and_one_deleted_elsewhere_is_lost(kube):
    kube.submit("--namespace", "team")
    mark = len(calls(kube.root))
    [listed] = kube.json("jobs")
    assert (listed["job_id"], listed["namespace"]) == ("k8s-gpt.team", "team")
    in_team = [["get", "job", "gpt", "-n", "team", "-o", "json"],
               ["get", "pods", "-l", "job-name=gpt", "-n", "team", "-o", "json"]]  # fmt: skip
    assert kube.calls_since(mark) == in_team

    cluster = load(kube.root)
    cluster["jobs"].clear()  # kubectl delete job gpt, by someone else
    save(kube.root, cluster)
    lost = kube.json("status", "k8s-gpt.team")
    assert (lost["state"], lost["error"]) == ("lost", "the cluster no longer has this Job (deleted outside distlaunch)")


def test_kubectl_missing_or_failing_is_one_line_naming_the_command(kube, tmp_path):
    kube.submit()
    no_kubectl = {"PATH": str(tmp_path / "empty")}
    r = kube.cli("status", "k8s-gpt", **no_kubectl)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "cannot run 'kubectl get job gpt -o json': kubectl is not on PATH" in r.stderr
    listed = kube.cli("jobs", **no_kubectl)  # the listing keeps the last known state
    assert listed.exit_code == 0 and "k8s-gpt" in listed.stdout and "pending" in listed.stdout

    start_pods(kube.root, "gpt")
    refused = "failed: The connection to the server 127.0.0.1:6443 was refused"
    pod = next(iter(load(kube.root)["pods"].values()))["metadata"]["name"]
    for down, args, command in (
        ("get", ("status", "k8s-gpt"), "'kubectl get job gpt -o json'"),
        ("logs", ("logs", "k8s-gpt", "--rank", "0"), f"'kubectl logs {pod}'"),
        ("delete", ("stop", "k8s-gpt"), "'kubectl delete job/gpt service/gpt --cascade=foreground --wait=true'"),
    ):
        unreachable(kube, down)
        r = kube.cli(*args)
        assert r.exit_code == 3 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert f"{command} {refused}" in r.stderr and "Traceback" not in r.stderr
    unreachable(kube)
    r = kube.cli("stacks", "k8s-gpt")
    assert (
        r.exit_code == 2
        and "job k8s-gpt is a k8s job: distlaunch stacks reaches only jobs of run and train" in r.stderr
    )


def unreachable(kube: Kube, *verbs: str) -> None:
    cluster = load(kube.root)
    cluster["unreachable"] = list(verbs)
    save(kube.root, cluster)
