"""``distlaunch k8s manifest``: a headless Service and an Indexed Job, one pod per node.

Pod i runs ``distlaunch run --nnodes N --node-rank $(JOB_COMPLETION_INDEX) ...`` (Kubernetes expands
``$(VAR)`` in a container's args from its environment). Pod 0 is the master: with ``subdomain`` set to the
headless Service, an Indexed Job's pod i is reachable as ``<name>-i.<name>``, the address every pod gets
in DISTLAUNCH_MASTER_ADDR.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, Field

from distlaunch.contract.env import parse_env
from distlaunch.errors import UsageError
from distlaunch.launcher.supervising.saves import FIT_MARGIN
from distlaunch.protocol import GRACE_PERIOD_S
from distlaunch.training.planner.saving import DEFAULT_SAVE_S, SaveEstimate, program_save_estimate

MASTER_ADDR_VAR = "DISTLAUNCH_MASTER_ADDR"
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1035 label: the Service's name is one
_SECRET_REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([a-z0-9]([-a-z0-9.]*[a-z0-9])?):([-._A-Za-z0-9]+)$")


class K8sJobOptions(BaseModel):
    """What ``distlaunch k8s manifest`` turns into Kubernetes objects."""

    program: list[str]  # SCRIPT [ARGS...] as given to distlaunch run (MODULE [ARGS...] with module)
    image: str
    module: bool = False  # distlaunch run -m: the program is a module, e.g. distlaunch.engine
    nodes: int = 1
    nproc_per_node: int = 1
    gpus_per_node: int = 0
    name: str = "distlaunch"
    namespace: str | None = None
    master_port: int = 29500
    rdzv_port: int = 29400  # the nodes' store (distlaunch run --rdzv-endpoint), apart from the ranks' master port
    backoff_limit: int = 0  # the Job's backoffLimit: failed pods tolerated
    env: list[str] = Field(default_factory=list)  # KEY=VALUE
    secret_env: list[str] = Field(default_factory=list)  # NAME=SECRET:KEY, read from the Secret by the kubelet
    grace_period: float | None = None  # the pods' distlaunch run --grace-period; None: from the save estimate


class TerminationGrace(BaseModel):
    """How long a pod has to stop: Kubernetes sends SIGTERM (an eviction, a preemption, kubectl delete), waits
    ``terminationGracePeriodSeconds``, then SIGKILLs. The pod's launcher saves first when the save fits in its
    ``--grace-period``, then stops the ranks (SIGTERM, the grace period, SIGKILL): so the pod gets the save and one
    grace period more."""

    seconds: int  # terminationGracePeriodSeconds: ceil(save_s) + grace_period
    grace_period: float  # the pods' launcher's --grace-period
    save_s: float  # the engine's save-on-request estimate (training/planner/saving.py), else DEFAULT_SAVE_S
    estimate: SaveEstimate | None = None
    how: str


def check_options(opts: K8sJobOptions) -> None:
    """Reject what Kubernetes or the per-node mode would reject later, with one line each."""
    if not opts.program:
        raise UsageError("no script given", "write: distlaunch k8s manifest [OPTIONS] -- train.py [ARGS]")
    for flag, value in (("--nodes", opts.nodes), ("--nproc-per-node", opts.nproc_per_node)):
        if value < 1:
            raise UsageError(f"{flag} {value} must be at least 1", f"give e.g. {flag} 2")
    if opts.gpus_per_node < 0 or opts.backoff_limit < 0:
        raise UsageError("--gpus-per-node and --backoff-limit cannot be negative", "give 0 or more")
    if opts.grace_period is not None and not 0 <= opts.grace_period <= 86400:
        raise UsageError(f"--grace-period {opts.grace_period:g} is out of range", "give seconds from 0 to 86400")
    if not opts.image.strip():
        raise UsageError("--image is empty", "give the container image that has distlaunch and your script")
    # Pod hostnames are <name>-<index>: the name must be a DNS label with room for the index.
    if not _NAME.match(opts.name) or len(opts.name) > 52:
        raise UsageError(
            f"--name {opts.name!r} is not a Kubernetes name",
            "use lowercase letters, digits and '-', starting with a letter, at most 52 characters, e.g. --name gpt-run1",
        )
    forwarded = next((item for item in opts.env if "=" not in item), None)
    if forwarded is not None:  # run's --env NAME forwards this machine's value: here it would be written out
        raise UsageError(
            f"--env {forwarded} would copy this machine's value of {forwarded} into the manifest, in plain text",
            f"give --env {forwarded}=VALUE, or --secret-env {forwarded}=SECRET:KEY for a secret",
        )
    names = [MASTER_ADDR_VAR, *parse_env(opts.env), *(pair.partition("=")[0] for pair in opts.secret_env)]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:  # Kubernetes keeps one of them, and which is not what anyone wrote
        raise UsageError(
            f"{twice} is set twice in the pods' environment"
            + (" (distlaunch sets it: the master's address)" if twice == MASTER_ADDR_VAR else ""),
            "give each variable once, with --env or --secret-env",
        )
    for port in (opts.master_port, opts.rdzv_port):
        if not 1 <= port <= 65535 or opts.master_port == opts.rdzv_port:
            raise UsageError(
                f"ports {opts.master_port} (master) and {opts.rdzv_port} (rendezvous) must be two ports 1-65535",
                "give --master-port and --rdzv-port",
            )


def secret_refs(pairs: list[str]) -> list[dict]:
    """``NAME=SECRET:KEY`` into env entries that reference the Secret (the value never enters the manifest)."""
    refs = []
    for pair in pairs:
        m = _SECRET_REF.match(pair)
        if m is None:
            raise UsageError(
                f"--secret-env {pair!r} is not NAME=SECRET:KEY",
                "write e.g. --secret-env HF_TOKEN=hf-credentials:token (a Secret name and a key in it)",
            )
        refs.append({"name": m[1], "valueFrom": {"secretKeyRef": {"name": m[2], "key": m[4]}}})
    return refs


def master_address(opts: K8sJobOptions) -> str:
    """Pod 0's DNS name through the headless Service."""
    return f"{opts.name}-0.{opts.name}"


def literal(text: str) -> str:
    """``text`` as Kubernetes must pass it on: it expands ``$(VAR)`` and turns ``$$`` into ``$`` in a
    container's args and env values, so every ``$`` of the user's own is doubled."""
    return text.replace("$", "$$")


def save_estimate(opts: K8sJobOptions) -> SaveEstimate | None:
    """The bundled engine's save-on-request time on this job's pods, or None for another program."""
    world_size = opts.nodes * opts.nproc_per_node
    return program_save_estimate(
        opts.module, opts.program, None, world_size, opts.nproc_per_node, opts.gpus_per_node > 0,
        "a volume every pod mounts",
    )  # fmt: skip


def termination_grace(opts: K8sJobOptions) -> TerminationGrace:
    """The pods' grace period (their launcher's, and Kubernetes' before SIGKILL), from the same save estimate as
    Slurm's warning. The launcher saves on SIGTERM only when its measured save and a step, with a quarter's
    margin, fit in its --grace-period: so that defaults to the estimate with that margin (at least 10 s)."""
    estimate = save_estimate(opts)
    save_s = estimate.seconds if estimate else float(DEFAULT_SAVE_S)
    grace = opts.grace_period
    if grace is None:
        grace = float(max(GRACE_PERIOD_S, math.ceil(save_s * FIT_MARGIN))) if estimate else GRACE_PERIOD_S
    seconds = math.ceil(save_s) + math.ceil(grace)
    part = estimate.describe() if estimate else f"{DEFAULT_SAVE_S} s to save (not the bundled engine: a default)"
    how = f"ceil({part}) + {grace:g} s --grace-period = {seconds} s"
    return TerminationGrace(seconds=seconds, grace_period=grace, save_s=save_s, estimate=estimate, how=how)


def pod_args(opts: K8sJobOptions, grace_period: float = GRACE_PERIOD_S) -> list[str]:
    """The args of ``distlaunch`` in every pod; Kubernetes fills in the ``$(VAR)`` references (ours only:
    the program's own words are ``literal``)."""
    return [
        "run",
        "--nnodes", str(opts.nodes),
        "--node-rank", "$(JOB_COMPLETION_INDEX)",
        "--master-addr", f"$({MASTER_ADDR_VAR})",
        "--master-port", str(opts.master_port),
        "--rdzv-endpoint", f"$({MASTER_ADDR_VAR}):{opts.rdzv_port}",
        "-n", str(opts.nproc_per_node),
        "--grace-period", f"{grace_period:g}",
        *(["-m"] if opts.module else []),
        "--",
        *map(literal, opts.program),
    ]  # fmt: skip


def _metadata(opts: K8sJobOptions, **extra) -> dict:
    meta = {"name": opts.name, "labels": {"app.kubernetes.io/name": "distlaunch", "distlaunch/job": opts.name}}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return {**meta, **extra}


def service(opts: K8sJobOptions) -> dict:
    """Headless Service: DNS names for the pods (pod 0 is the master), no load balancing."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(opts),
        "spec": {
            "clusterIP": "None",
            "selector": {"distlaunch/job": opts.name},
            # The ranks look pod 0 up while it starts, before any readiness.
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": "master", "port": opts.master_port, "targetPort": opts.master_port},
                {"name": "rdzv", "port": opts.rdzv_port, "targetPort": opts.rdzv_port},
            ],
        },
    }


def container(opts: K8sJobOptions, grace_period: float = GRACE_PERIOD_S) -> dict:
    env = [{"name": MASTER_ADDR_VAR, "value": master_address(opts)}]
    env += [{"name": k, "value": literal(v)} for k, v in parse_env(opts.env).items()]
    env += secret_refs(opts.secret_env)
    spec = {
        "name": "trainer",
        "image": opts.image,
        "command": ["distlaunch"],
        "args": pod_args(opts, grace_period),
        "env": env,
        "ports": [{"containerPort": opts.master_port}, {"containerPort": opts.rdzv_port}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if opts.gpus_per_node:
        spec["resources"] = {"limits": {"nvidia.com/gpu": opts.gpus_per_node}}
    return spec


def job(opts: K8sJobOptions) -> dict:
    """Indexed Job: one pod per node, node rank = completion index; the whole job retried up to backoffLimit."""
    grace = termination_grace(opts)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(opts, annotations={"distlaunch/termination-grace": grace.how}),
        "spec": {
            "completionMode": "Indexed",
            "completions": opts.nodes,
            "parallelism": opts.nodes,
            "backoffLimit": opts.backoff_limit,
            "template": {
                "metadata": {"labels": {"distlaunch/job": opts.name}},
                "spec": {
                    "subdomain": opts.name,  # with the headless Service: <name>-<index>.<name> resolves
                    "restartPolicy": "Never",
                    # SIGTERM, then this long to save a checkpoint and stop the ranks, then SIGKILL
                    "terminationGracePeriodSeconds": grace.seconds,
                    "containers": [container(opts, grace.grace_period)],
                    # NCCL and DataLoader workers share memory through /dev/shm; a container's default is 64 MiB.
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                },
            },
        },
    }


def manifest(opts: K8sJobOptions) -> list[dict]:
    """The objects to apply, in order: the Service first, so pod 0's name resolves when the pods start."""
    check_options(opts)
    return [service(opts), job(opts)]


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """``$(VAR)`` references and ``$$`` as Kubernetes expands them in a container's args (unknown references
    stay as written)."""
    pattern = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
    return [pattern.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), arg) for arg in args]
