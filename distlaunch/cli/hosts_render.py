"""The hosts' inventory for people: under each host's name, a table of what it has (GPUs, CPUs and NUMA nodes,
memory, interfaces, InfiniBand, driver and NCCL); a host that did not answer is one line saying why."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from distlaunch.contract.inventory import HostInventory, Interface
from distlaunch.hostprobe import format_cpulist
from distlaunch.readable import plural

if TYPE_CHECKING:  # the doctor's machinery loads for `distlaunch hosts` only, not for `status`, which draws a host too
    from distlaunch.doctor.hosts import HostAnswer, HostsReport


def gpus_line(inv: HostInventory) -> str:
    """'8 × NVIDIA H100 80GB HBM3, 79.6 GiB each' (models and memories grouped), or 'none'."""
    if not inv.gpus:
        return "none"
    kinds: dict[tuple[str, int | None], int] = {}
    for gpu in inv.gpus:
        key = (gpu.model or "unknown model", gpu.memory_mib)
        kinds[key] = kinds.get(key, 0) + 1
    parts = [
        f"{count} × {model}" + (f", {mib / 1024:.1f} GiB each" if mib is not None else "")
        for (model, mib), count in kinds.items()
    ]
    nodes = [g.numa_node for g in inv.gpus]
    where = (
        "" if all(n is None for n in nodes) else "; NUMA node " + " ".join("?" if n is None else str(n) for n in nodes)
    )
    return "; ".join(parts) + where


def cpus_line(inv: HostInventory) -> str:
    """'64 (usable 0-63); NUMA 0: 0-31, 1: 32-63'."""
    usable = format_cpulist(inv.affinity)
    head = f"{inv.cpus if inv.cpus is not None else '?'}" + (f" (usable {usable})" if usable else "")
    if not inv.numa_nodes:
        return head
    return f"{head}; NUMA " + ", ".join(f"{n.id}: {format_cpulist(n.cpus) or 'no CPUs'}" for n in inv.numa_nodes)


def memory_line(inv: HostInventory) -> str:
    """'503.6 GiB (486.3 GiB available)': MemTotal and MemAvailable, or '?'."""
    if inv.memory_mib is None:
        return "?"
    free = f" ({inv.memory_available_mib / 1024:.1f} GiB available)" if inv.memory_available_mib is not None else ""
    return f"{inv.memory_mib / 1024:.1f} GiB{free}"


def interface_line(interface: Interface) -> str:
    """'eth0 up 25 Gb/s 10.0.0.5/24' (IPv6 link-local addresses left out: every interface has one)."""
    speed = f" {interface.speed_mbps / 1000:g} Gb/s" if interface.speed_mbps else ""
    addresses = [a for a in interface.addresses if not a.lower().startswith("fe80:")]
    return f"{interface.name} {interface.state or '?'}{speed}" + "".join(f" {a}" for a in addresses)


def ib_lines(inv: HostInventory) -> list[str]:
    """A line per InfiniBand port: 'mlx5_0:1 ACTIVE 200 Gb/s InfiniBand'."""
    lines = []
    for device in inv.ib_devices:
        for port in device.ports:
            rate = f" {port.rate_gbps:g} Gb/s" if port.rate_gbps is not None else ""
            lines.append(f"{device.name}:{port.port} {port.state or '?'}{rate} {port.link_layer or ''}".rstrip())
        if not device.ports:
            lines.append(f"{device.name} (no ports)")
    return lines


def inventory_table(inv: HostInventory) -> Table:
    """One host's facts, a row each."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row("GPUs", gpus_line(inv))
    table.add_row("CPUs", cpus_line(inv))
    table.add_row("memory", memory_line(inv))
    shown = [i for i in inv.interfaces if i.name != "lo"] or inv.interfaces
    table.add_row("network", "\n".join(map(interface_line, shown)) or "none found")
    table.add_row("InfiniBand", "\n".join(ib_lines(inv)) or "none")
    versions = f"NVIDIA driver {inv.cuda_driver or 'none'}, NCCL {inv.nccl or 'none'}"
    table.add_row("versions", versions)
    return table


def failed_line(answer: HostAnswer) -> Text:
    """'node4: <why> (<the fix>)'."""
    hint = f" ({answer.hint})" if answer.hint else ""
    return Text(f"{answer.host}: {answer.error}{hint}", style="bold red")


def render_hosts(report: HostsReport, console: Console) -> None:
    """Each host under its name (a heading, so a long name never narrows the table), then how many answered."""
    for answer in report.hosts:
        if answer.inventory is None:
            console.print(failed_line(answer))
            continue
        console.print(Text(answer.host, style="bold cyan"))
        console.print(inventory_table(answer.inventory))
    missing = sum(a.inventory is None for a in report.hosts)
    total = plural(len(report.hosts), "host")
    if missing:
        console.print(Text(f"{missing} of {total} did not answer", style="bold red"))
