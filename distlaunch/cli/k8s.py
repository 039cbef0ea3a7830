"""``distlaunch k8s manifest|submit``: an Indexed Job and a headless Service whose pods run the per-node mode."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from distlaunch.backends.kubernetes import Kubernetes
from distlaunch.cli.groups import command_line
from distlaunch.k8s.manifest import K8sJobOptions, manifest
from distlaunch.k8s.yaml import dump_all
from distlaunch.launcher.planning.spec import parse_seconds

k8s_app = typer.Typer(
    name="k8s", help="Run a job on Kubernetes: an Indexed Job, one pod per node, no operator.", no_args_is_help=True
)
_SCRIPT_CONTEXT = {"allow_interspersed_args": False}

Program = Annotated[list[str], typer.Argument(help="-- SCRIPT [ARGS]...: what distlaunch run starts in every pod.")]
Nodes = Annotated[int, typer.Option("-N", "--nodes", help="Pods (one per node); parallelism = completions.")]
Nproc = Annotated[int, typer.Option("-n", "--nproc-per-node", help="Ranks per pod.")]
Image = Annotated[str, typer.Option("--image", help="Container image with distlaunch and the script.")]
Gpus = Annotated[int, typer.Option("--gpus-per-node", help="nvidia.com/gpu limit per pod (0: none).")]
Env = Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE in every pod (repeatable).")]
SecretEnv = Annotated[
    list[str] | None,
    typer.Option(
        "--secret-env",
        help="Set NAME from key KEY of Secret SECRET, given as NAME=SECRET:KEY (by reference, repeatable).",
    ),
]
MaxRestarts = Annotated[int, typer.Option("--max-restarts", help="The Job's backoffLimit: pod failures tolerated.")]
Name = Annotated[str, typer.Option("--name", help="Name of the Job and the Service; pod 0 is NAME-0.NAME.")]
Namespace = Annotated[str | None, typer.Option("--namespace", help="Namespace (default: kubectl's).")]
MasterPort = Annotated[int, typer.Option("--master-port", help="Port of rank 0 (init_process_group).")]
RdzvPort = Annotated[int, typer.Option("--rdzv-port", help="Port where the pods meet (distlaunch's node store).")]
Json = Annotated[bool, typer.Option("--json", help="Print the objects as a JSON list instead of YAML.")]
Module = Annotated[
    bool, typer.Option("-m", "--module", help="The program is a module (distlaunch run -m), e.g. distlaunch.engine.")
]
GracePeriod = Annotated[
    float | None,
    typer.Option(
        "--grace-period",
        parser=parse_seconds,
        metavar="S",
        help="The pods' seconds from SIGTERM to SIGKILL for their ranks (distlaunch run --grace-period). Default: the "
        "bundled engine's save estimate, at least 10. terminationGracePeriodSeconds is it plus the save estimate.",
        show_default=False,
    ),
]


def _opts(
    program, nodes, nproc, image, gpus, env, secret_env, max_restarts, name, namespace, master_port, rdzv_port, **more
):
    return K8sJobOptions(
        program=program,
        image=image,
        nodes=nodes,
        nproc_per_node=nproc,
        gpus_per_node=gpus,
        name=name,
        namespace=namespace,
        master_port=master_port,
        rdzv_port=rdzv_port,
        max_restarts=max_restarts,
        env=env or [],
        secret_env=secret_env or [],
        **more,
    )


@k8s_app.command("manifest", context_settings=_SCRIPT_CONTEXT)
def manifest_cmd(
    program: Program,
    image: Image,
    nodes: Nodes = 1,
    nproc_per_node: Nproc = 1,
    gpus_per_node: Gpus = 0,
    env: Env = None,
    secret_env: SecretEnv = None,
    max_restarts: MaxRestarts = 0,
    name: Name = "distlaunch",
    namespace: Namespace = None,
    master_port: MasterPort = 29500,
    rdzv_port: RdzvPort = 29400,
    module: Module = False,
    grace_period: GracePeriod = None,
    json_output: Json = False,
) -> int:
    """Print a headless Service and an Indexed Job (YAML, or JSON with --json) for kubectl apply -f."""
    objects = manifest(
        _opts(
            program,
            nodes,
            nproc_per_node,
            image,
            gpus_per_node,
            env,
            secret_env,
            max_restarts,
            name,
            namespace,
            master_port,
            rdzv_port,
            module=module,
            grace_period=grace_period,
        )
    )
    print(json.dumps(objects, indent=2) if json_output else dump_all(objects), end="" if not json_output else "\n")
    return 0


@k8s_app.command("submit", context_settings=_SCRIPT_CONTEXT)
def submit_cmd(
    program: Program,
    image: Image,
    nodes: Nodes = 1,
    nproc_per_node: Nproc = 1,
    gpus_per_node: Gpus = 0,
    env: Env = None,
    secret_env: SecretEnv = None,
    max_restarts: MaxRestarts = 0,
    name: Name = "distlaunch",
    namespace: Namespace = None,
    master_port: MasterPort = 29500,
    rdzv_port: RdzvPort = 29400,
    module: Module = False,
    grace_period: GracePeriod = None,
) -> int:
    """Apply the manifest with kubectl apply -f - (kubectl must be on PATH) and record the job (distlaunch jobs)."""
    opts = _opts(
        program,
        nodes,
        nproc_per_node,
        image,
        gpus_per_node,
        env,
        secret_env,
        max_restarts,
        name,
        namespace,
        master_port,
        rdzv_port,
        module=module,
        grace_period=grace_period,
    )
    code, job_id = Kubernetes().submit(opts, command_line())
    if job_id is not None:
        sys.stderr.write(f"distlaunch: recorded as job {job_id}: distlaunch status {job_id} | logs | stop\n")
    return code
