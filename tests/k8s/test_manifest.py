"""``distlaunch k8s``: the objects it prints, and the pods' command run here as Kubernetes would run it."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import yaml

import distlaunch.examples
from distlaunch.contract.endpoint import free_port
from distlaunch.k8s.manifest import expand
from distlaunch.k8s.yaml import dump_all
from distlaunch.launcher.supervising.saves import FIT_MARGIN
from distlaunch.training.planner.saving import DEFAULT_SAVE_S, engine_save_estimate
from tests.helpers import distlaunch_cmd, finish, invoke

ALLREDUCE = str(Path(distlaunch.examples.__file__).parent / "allreduce.py")
BASE = ["k8s", "manifest", "--nodes", "2", "--nproc-per-node", "4", "--image", "registry.example/train:1"]


def objects(*extra: str) -> list[dict]:
    r = invoke([*BASE, "--json", *extra, "--", "train.py", "--lr", "3e-4"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_json_has_a_headless_service_and_an_indexed_job():
    extra = ["--gpus-per-node", "4", "--backoff-limit", "3", "--name", "gpt", "--env", "A=1 2"]
    service, job = objects(*extra, "--secret-env", "HF_TOKEN=hf-creds:token")
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == job["spec"]["template"]["metadata"]["labels"]
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2 and spec["backoffLimit"] == 3
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "gpt" and pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/train:1" and c["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert c["command"] == ["distlaunch"]
    args = c["args"]
    assert args[:9] == ["run", "--nnodes", "2", "--node-rank", "$(JOB_COMPLETION_INDEX)", "--master-addr",
                        "$(DISTLAUNCH_MASTER_ADDR)", "--master-port", "29500"]  # fmt: skip
    assert args[-4:] == ["--", "train.py", "--lr", "3e-4"] and args[args.index("-n") + 1] == "4"
    env = {e["name"]: e for e in c["env"]}
    assert env["DISTLAUNCH_MASTER_ADDR"]["value"] == "gpt-0.gpt" and env["A"]["value"] == "1 2"
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-creds", "key": "token"}}}
    assert c["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def test_no_gpus_means_no_gpu_limit():
    _, job = objects()
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]


def test_yaml_output_reads_back_as_the_json_objects():
    options = [*BASE, "--secret-env", "T=s:k"]
    program = ["--", "train.py", "on", "0755", "a: b", "ü'\"", "$(X)"]
    as_yaml, as_json = invoke([*options, *program]), invoke([*options, "--json", *program])
    assert as_yaml.exit_code == as_json.exit_code == 0, as_yaml.stderr
    assert list(yaml.safe_load_all(as_yaml.stdout)) == json.loads(as_json.stdout)


def test_yaml_writer_keeps_types_of_tricky_values():
    doc = {
        "a": ["on", "no", "0755", "1e3", "", "x: y", "- z", "#c", None, True, 3, 1.5],
        "b": {},
        "c": [],
        "d": [[1, 2], {"e": []}],
    }
    assert list(yaml.safe_load_all(dump_all([doc, {"k": "v"}]))) == [doc, {"k": "v"}]
    # DEL and the C1 controls: raw, YAML refused the one (unacceptable character) and read NEL as a space
    odd = {"e": ["a\x7fb", "x\x85y", "line\u2028sep", "é ✓"]}
    assert list(yaml.safe_load_all(dump_all([odd]))) == [odd]


def test_dollars_of_the_users_own_reach_the_pod_as_written():
    # Kubernetes expands $(VAR) and turns $$ into $ in args and env values: the user's own are doubled
    words = ["$$", "$(JOB_COMPLETION_INDEX)", "cost: $5"]
    r = invoke([*BASE, "--json", "--env", "C=$$x $(DISTLAUNCH_MASTER_ADDR)", "--", "train.py", *words])
    assert r.exit_code == 0, r.stderr
    (c,) = json.loads(r.stdout)[1]["spec"]["template"]["spec"]["containers"]
    pod = {"JOB_COMPLETION_INDEX": "1", "DISTLAUNCH_MASTER_ADDR": "distlaunch-0.distlaunch"}
    args = expand(c["args"], pod)
    assert args[args.index("--") + 1 :] == ["train.py", *words]
    assert args[args.index("--node-rank") + 1] == "1"  # ours still expanded
    (value,) = [e["value"] for e in c["env"] if e["name"] == "C"]
    assert expand([value], pod) == ["$$x $(DISTLAUNCH_MASTER_ADDR)"]


def test_bad_k8s_options_are_one_line_and_exit_2():
    cases = {
        ("--secret-env", "HF_TOKEN=abc123"): "--secret-env 'HF_TOKEN=abc123' is not NAME=SECRET:KEY",
        ("--name", "My_Job"): "--name 'My_Job' is not a Kubernetes name",
        ("--nodes", "0"): "--nodes 0 must be at least 1",
        ("--env", "=x"): "--env '=x' is not KEY=VALUE",
        ("--name", "1abc"): "--name '1abc' is not a Kubernetes name",  # a Service name starts with a letter
        # run's --env NAME forwards this machine's value: into a manifest, in plain text
        ("--env", "HOME"): "--env HOME would copy this machine's value of HOME into the manifest, in plain text",
        ("--env", "DISTLAUNCH_MASTER_ADDR=x"): "DISTLAUNCH_MASTER_ADDR is set twice in the pods' environment",
        ("--env", "A=1", "--secret-env", "A=s:k"): "A is set twice in the pods' environment",
    }
    for args, message in cases.items():
        r = invoke([*BASE, *args, "--", "train.py"])
        assert r.exit_code == 2, (args, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_submit_without_kubectl_says_so(tmp_path):
    r = invoke(["k8s", "submit", "--image", "i", "--", "train.py"], env={"PATH": str(tmp_path)})
    assert r.exit_code == 2 and "kubectl is not on PATH" in r.stderr


def test_submit_pipes_the_manifest_to_kubectl_apply(tmp_path):
    # A stand-in kubectl that records its arguments and what it was given on stdin.
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/argv\ncat > {tmp_path}/stdin\n')
    kubectl.chmod(0o755)
    r = invoke(["k8s", "submit", "--image", "i", "--", "train.py"], env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "argv").read_text().split() == ["apply", "-f", "-"]
    kinds = [o["kind"] for o in yaml.safe_load_all((tmp_path / "stdin").read_text())]
    assert kinds == ["Service", "Job"]


def test_the_pod_command_for_each_index_forms_a_working_job():
    master, rdzv = free_port(), free_port()
    r = invoke(["k8s", "manifest", "--nodes", "2", "--nproc-per-node", "2", "--image", "i", "--env", "DLTEST=k8s",
                "--master-port", str(master), "--rdzv-port", str(rdzv), "--json", "--", ALLREDUCE])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    (c,) = json.loads(r.stdout)[1]["spec"]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e["value"] for e in c["env"]}
    procs = []
    for index in range(2):
        # What Kubernetes gives pod <index>; pod 0's DNS name becomes this machine's loopback address.
        env = {**pod_env, "JOB_COMPLETION_INDEX": str(index), "DISTLAUNCH_MASTER_ADDR": "127.0.0.1"}
        argv = distlaunch_cmd(*expand(c["args"], env))
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **env}))  # fmt: skip
    results = finish(procs)
    for code, _, err in results:
        assert code == 0, err
    out = "".join(o for _, o, _ in results)
    assert sum(f"rank {r}/4 (gloo): all_reduce(sum of rank+1) = 10 (ok)" in out for r in range(4)) == 4


def test_manifest_and_per_node_dry_run_do_not_import_torch():
    code = (
        "import sys; from distlaunch.cli.app import main; "
        "main(['k8s', 'manifest', '--image', 'i', '--json', '--', 't.py']); "
        "main(['run', '--nnodes', '2', '--node-rank', '1', '--master-addr', 'a', '--master-port', '5', '--dry-run', 'x.py']); "
        "print('TORCH', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "TORCH False" in out


def pod_spec(*args: str) -> dict:
    r = invoke([*BASE, "--json", *args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)[1]["spec"]["template"]["spec"]


def test_pods_get_the_time_to_save_a_checkpoint_before_sigkill():
    """terminationGracePeriodSeconds: the bundled engine's save estimate (as for Slurm's warning, without Slurm's
    60 s resolution) plus the pods' launcher grace period, which itself holds the save (its SIGTERM save needs it)."""
    engine = ["-m", "--", "distlaunch.engine", "--set", "model.preset='125m'", "--set", "checkpoint.dir=/ckpt"]
    pod = pod_spec(*engine)
    found = engine_save_estimate(["--set", "model.preset='125m'", "--set", "checkpoint.dir=/ckpt"], None, 8, 4, False)
    estimate = found[0]
    grace = max(10, math.ceil(estimate.seconds * FIT_MARGIN))
    assert pod["terminationGracePeriodSeconds"] == math.ceil(estimate.seconds) + grace
    (c,) = pod["containers"]
    assert c["args"][c["args"].index("--grace-period") + 1] == str(grace)
    assert c["args"][c["args"].index("--") - 1 :][:3] == ["-m", "--", "distlaunch.engine"]
    # a script distlaunch cannot look into: the documented default save time, and the launcher's own 10 s
    script = pod_spec("--", "train.py")
    assert script["terminationGracePeriodSeconds"] == DEFAULT_SAVE_S + 10
    assert script["containers"][0]["args"][script["containers"][0]["args"].index("--grace-period") + 1] == "10"
    given = pod_spec("--grace-period", "45", "--", "train.py")
    assert given["terminationGracePeriodSeconds"] == DEFAULT_SAVE_S + 45


def test_the_grace_time_is_explained_on_the_job():
    _, job = objects()
    how = job["metadata"]["annotations"]["distlaunch/termination-grace"]
    assert how == "ceil(120 s to save (not the bundled engine: a default)) + 10 s --grace-period = 130 s"


def test_the_pods_run_the_engine_as_a_module():
    """-m reaches the pods' distlaunch run before the program: the per-node dry run of pod 1 shows the engine."""
    pod = pod_spec("-m", "--", "distlaunch.engine", "--set", "train.steps=5")
    (c,) = pod["containers"]
    args = expand(c["args"], {"JOB_COMPLETION_INDEX": "1", "DISTLAUNCH_MASTER_ADDR": "127.0.0.1"})
    cut = args.index("--")
    r = invoke([*args[:cut], "--dry-run", "--json", *args[cut:]])
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    argv = plan["nodes"][0]["ranks"][0]["argv"]
    assert argv[-4:] == ["-m", "distlaunch.engine", "--set", "train.steps=5"], argv


def test_a_bad_grace_period_is_one_line():
    r = invoke([*BASE, "--grace-period", "-1", "--", "train.py"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--grace-period -1 is out of range" in r.stderr
