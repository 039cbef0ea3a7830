"""This node's part of a job started once per node (``--nnodes``, torchrun's multi-node form).

The nodes meet at a rendezvous (distlaunch/launcher/elastic/rendezvous.py); each node's launcher records and drives
its own ranks, so a recorded per-node job is answered as any launcher-driven one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlaunch.backends.base import LaunchRequest
from distlaunch.backends.hosts import LauncherDriven
from distlaunch.contract.sink import Sink

if TYPE_CHECKING:
    from distlaunch.contract.report import RunReport
    from distlaunch.launcher.planning.plan import LaunchPlan


class Node(LauncherDriven["LaunchPlan"]):
    name = "per-node (--nnodes)"
    records = ()  # its launcher records the job as local or ssh: Hosts answers for it

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        from distlaunch.launcher.elastic.pernode import dry_run_plan

        exec_opts = request.exec_opts
        return dry_run_plan(request.opts, request.node, exec_opts.workdir, exec_opts.flight_recorder)

    def run(self, request: LaunchRequest, plan: LaunchPlan, sink: Sink) -> RunReport:
        from distlaunch.launcher.running.node import launch_node

        return launch_node(request.opts, request.node, request.exec_opts, sink)
