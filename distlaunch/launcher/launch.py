"""The launcher's front door: options → plan → execution, for ``run`` and ``train`` alike."""

from __future__ import annotations

from distlaunch.errors import HostError
from distlaunch.launcher.job import Connect, ExecOptions, Sink, execute
from distlaunch.launcher.plan import LaunchPlan, build_plan
from distlaunch.launcher.report import RunReport
from distlaunch.launcher.spec import LaunchOptions, check_script, is_local_host, make_spec
from distlaunch.launcher.transport import LocalAgent


def plan_for(opts: LaunchOptions) -> LaunchPlan:
    """Resolve the options and build the plan (reads the hostfile; starts nothing)."""
    return build_plan(make_spec(opts))


def make_connect(opts: LaunchOptions) -> Connect:
    """Local hosts get a child-process agent; remote hosts an agent over SSH."""

    def connect(node, events):
        if is_local_host(node.host):
            return LocalAgent(node.node_rank, node.host, events)
        raise HostError(f"host {node.host!r} is not this machine and SSH launch is not available in this build",
                        "run on this machine only (no hostfile), or use a hostfile of localhost")

    return connect


def launch(plan: LaunchPlan, opts: LaunchOptions, exec_opts: ExecOptions, sink: Sink) -> RunReport:
    """Execute a plan built from ``opts`` and report how it ended."""
    check_script(opts, all(is_local_host(node.host) for node in plan.nodes))
    return execute(plan, exec_opts, sink, make_connect(opts))
