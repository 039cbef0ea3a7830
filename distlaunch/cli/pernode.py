"""``distlaunch run --nnodes N``: this node's part of a job started once on every node."""

from __future__ import annotations

import sys

from rich.console import Console

from distlaunch.cli.output import RankPrinter
from distlaunch.cli.render import print_json, render_plan, render_report
from distlaunch.launcher.job import ExecOptions
from distlaunch.launcher.pernode import NodeOptions, dry_run_plan, launch_node
from distlaunch.launcher.spec import LaunchOptions


def run_node(opts: LaunchOptions, node: NodeOptions, exec_opts: ExecOptions, dry_run: bool, json_output: bool) -> int:
    """Show this node's part of the plan, or meet the other nodes and run it."""
    if dry_run:
        plan = dry_run_plan(opts, node)
        print_json(plan.masked()) if json_output else render_plan(plan, Console(stderr=json_output))
        return 0
    sink = RankPrinter(multi_host=False, out=sys.stderr if json_output else None)
    try:
        report = launch_node(opts, node, exec_opts, sink)
    finally:
        sink.close()  # what the terminal still takes, never waiting on a stalled one
    render_report(report, Console(stderr=True))
    if json_output:
        print_json(report)
    return report.exit_code
