"""``distlaunch hosts``: what every host has (GPUs, CPUs and NUMA nodes, interfaces, InfiniBand), as the hosts
themselves report it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from distlaunch.cli import groups as g
from distlaunch.cli.options import StartTimeout
from distlaunch.cli.render import print_json
from distlaunch.errors import ExitCode

if TYPE_CHECKING:
    from distlaunch.doctor import DoctorOptions

HOSTS_OPTIONS = (
    *g.retold(
        g.HOST_OPTIONS, remote_python="Python on remote hosts that runs the probe (default: the launcher's own path)."
    ),
    g.Opt("start_timeout", StartTimeout, 20.0),
)


def hosts_options(values: dict[str, Any], ctx: typer.Context) -> DoctorOptions:
    """Which hosts to ask, and how (--remote-python unset or empty: the launcher's own)."""
    from distlaunch.doctor import DoctorOptions  # SSH stack: only when used

    return DoctorOptions(**g.fields_of(DoctorOptions, {**values, "remote_python": values["remote_python"] or None}))


@g.with_options(HOSTS_OPTIONS, build=hosts_options, into="opts")
def hosts(
    opts: DoctorOptions,
    json_output: Annotated[bool, typer.Option("--json", help="Print the inventory as JSON.")] = False,
) -> int:
    """Show what every host has: GPUs (model, memory, NUMA node), CPUs and NUMA nodes, interfaces, InfiniBand, driver and NCCL.

    Each host answers for itself over SSH (without -H: this machine).

    Exit code: 0 when every host answered, 3 when one could not be reached or could not run the probe, 2 when the
    hostfile or an option is wrong.
    """
    from distlaunch.cli.hosts_render import render_hosts
    from distlaunch.doctor.hosts import host_inventories  # SSH stack: only when used

    report = host_inventories(opts)
    print_json(report) if json_output else render_hosts(report, Console())
    return ExitCode.OK if report.ok else ExitCode.HOST
