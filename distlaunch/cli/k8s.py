"""``distlaunch k8s manifest|submit``: an Indexed Job and a headless Service whose pods run the per-node mode."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from distlaunch.backends.registry import named
from distlaunch.cli import groups as g
from distlaunch.cli import panels as h
from distlaunch.cli.options import refused
from distlaunch.cli.render import print_submission
from distlaunch.launcher.planning.spec import parse_seconds

k8s_app = typer.Typer(
    name="k8s", help="Run a job on Kubernetes: an Indexed Job, one pod per node, no operator.", no_args_is_help=True
)
_SCRIPT_CONTEXT = {"allow_interspersed_args": False}

Program = Annotated[list[str], typer.Argument(help="-- SCRIPT [ARGS]...: what distlaunch run starts in every pod.")]
Nodes = Annotated[
    int, typer.Option("-N", "--nodes", help="Pods (one per node); parallelism = completions.", rich_help_panel=h.HOSTS)
]
NNodesAlias = Annotated[int | None, typer.Option("--nnodes", hidden=True)]  # run's word for -N
Nproc = Annotated[int, typer.Option("-n", "--nproc-per-node", help="Ranks per pod.", rich_help_panel=h.HOSTS)]
Image = Annotated[
    str,
    typer.Option(
        "--image", metavar="IMAGE", help="Container image with distlaunch and the script.", rich_help_panel=h.RUN
    ),
]
Gpus = Annotated[
    int, typer.Option("--gpus-per-node", help="nvidia.com/gpu limit per pod (0: none).", rich_help_panel=h.HOSTS)
]
Env = Annotated[
    list[str] | None,
    typer.Option("--env", metavar="KEY=VALUE", help="KEY=VALUE in every pod (repeatable).", rich_help_panel=h.RUN),
]
SecretEnv = Annotated[
    list[str] | None,
    typer.Option(
        "--secret-env",
        metavar="NAME=SECRET:KEY",
        rich_help_panel=h.RUN,
        help="Set NAME from key KEY of Secret SECRET, given as NAME=SECRET:KEY (by reference, repeatable).",
    ),
]
BackoffLimit = Annotated[
    int,
    typer.Option(
        "--backoff-limit",
        metavar="N",
        help="The Job's backoffLimit: pod failures tolerated before the Job fails. A failed attempt fails every pod,"
        " so R × nodes lets the job start again R times.",
        rich_help_panel=h.FAULTS,
    ),
]
# run's --max-restarts restarts the whole job K times; a Job counts failed pods: another number, another word
MaxRestarts = refused(
    "--max-restarts",
    why="--max-restarts is run's: it restarts the whole job; a Kubernetes Job retries failed pods",
    fix="give --backoff-limit N, the pod failures tolerated (a failed attempt fails every pod: R × nodes for R"
    " restarts)",
)
Name = Annotated[
    str,
    typer.Option(
        "--name", metavar="NAME", help="Name of the Job and the Service; pod 0 is NAME-0.NAME.", rich_help_panel=h.RUN
    ),
]
Namespace = Annotated[
    str | None,
    typer.Option("--namespace", metavar="NAMESPACE", help="Namespace (default: kubectl's).", rich_help_panel=h.RUN),
]
MasterPort = Annotated[
    int,
    typer.Option(
        "--master-port", metavar="PORT", help="Port of rank 0 (init_process_group).", rich_help_panel=h.CONNECT
    ),
]
RdzvPort = Annotated[
    int,
    typer.Option(
        "--rdzv-port",
        metavar="PORT",
        help="Port where the pods meet (distlaunch's node store).",
        rich_help_panel=h.CONNECT,
    ),
]
Json = Annotated[
    bool, typer.Option("--json", help="Print the objects as a JSON list instead of YAML.", rich_help_panel=h.OUTPUT)
]
Module = Annotated[
    bool,
    typer.Option(
        "-m",
        "--module",
        help="The program is a module (distlaunch run -m), e.g. distlaunch.engine.",
        rich_help_panel=h.RUN,
    ),
]
GracePeriod = Annotated[
    float | None,
    typer.Option(
        "--grace-period",
        parser=parse_seconds,
        metavar="SECONDS",
        rich_help_panel=h.FAULTS,
        help="The pods' seconds from SIGTERM to SIGKILL for their ranks (distlaunch run --grace-period). Default: the "
        "bundled engine's save estimate, at least 10. terminationGracePeriodSeconds is it plus the save estimate.",
        show_default=False,
    ),
]

# The job's options, in the order --help lists them; each fills the K8sJobOptions field of its name.
K8S_OPTIONS = (
    g.Opt("program", Program),
    g.Opt("image", Image),
    g.Opt("nodes", Nodes, 1),
    g.Opt("nnodes", NNodesAlias, None, alias_of="nodes"),
    g.Opt("nproc_per_node", Nproc, 1),
    g.Opt("gpus_per_node", Gpus, 0),
    g.Opt("env", Env, None),
    g.Opt("secret_env", SecretEnv, None),
    g.Opt("backoff_limit", BackoffLimit, 0),
    g.Opt("max_restarts", MaxRestarts, None),
    g.Opt("name", Name, "distlaunch"),
    g.Opt("namespace", Namespace, None),
    g.Opt("master_port", MasterPort, 29500),
    g.Opt("rdzv_port", RdzvPort, 29400),
    g.Opt("module", Module, False),
    g.Opt("grace_period", GracePeriod, None),
)


def k8s_options(command: Callable) -> Callable:
    """The job's options, handed to the command as ``job``: each one's value by name (the backend builds the job)."""
    return g.with_options(K8S_OPTIONS, build=lambda values, ctx: values, into="job")(command)


@k8s_app.command("manifest", context_settings=_SCRIPT_CONTEXT)
@k8s_options
def manifest_cmd(job: dict[str, Any], json_output: Json = False) -> int:
    """Print a headless Service and an Indexed Job (YAML, or JSON with --json) for kubectl apply -f."""
    print_submission(named("k8s").submission(job), json_output)
    return 0


@k8s_app.command("submit", context_settings=_SCRIPT_CONTEXT)
@k8s_options
def submit_cmd(job: dict[str, Any]) -> int:
    """Apply the manifest with kubectl apply -f - (kubectl must be on PATH) and record the job (distlaunch jobs)."""
    k8s = named("k8s")
    applied = k8s.submit(k8s.submission(job), sys.stdout, g.command_line())
    if applied.job_id is not None:
        sys.stderr.write(
            f"distlaunch: recorded as job {applied.job_id}: distlaunch status {applied.job_id} | logs | stop\n"
        )
    return applied.exit_code
