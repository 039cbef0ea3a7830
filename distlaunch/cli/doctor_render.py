"""The doctor's report for people: one rich table grouped by host (green / yellow / red, the hint under
each problem, skipped checks folded into one line) and a one-line verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from distlaunch.doctor.model import BenchResult, Check, DoctorReport

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def _by_host(checks: list[Check]) -> dict[str, list[Check]]:
    hosts: dict[str, list[Check]] = {}
    for c in checks:
        hosts.setdefault(c.host, []).append(c)
    return hosts


def _skipped_row(skipped: list[Check]) -> tuple[Text, Text, Text]:
    """Skipped checks in one row, grouped by why: 'ssh.connect, ssh.auth: this machine: no SSH needed'."""
    by_reason: dict[str, list[str]] = {}
    for c in skipped:
        by_reason.setdefault(c.detail, []).append(c.id)
    text = "; ".join(f"{', '.join(ids)}: {reason}" for reason, ids in by_reason.items())
    return Text("skip", style="dim"), Text(f"{len(skipped)} check(s)", style="dim"), Text(text, style="dim")


def verdict(report: DoctorReport) -> Text:
    """One line: how many checks failed or warned, on how many hosts."""
    counts = {s: sum(c.status == s for c in report.checks) for s in STYLE}
    hosts = len({c.host for c in report.checks if c.host != "(local)"})
    scope = f"{hosts} host" + ("s" if hosts != 1 else "")
    warned = f", {counts['warn']} warning(s)" if counts["warn"] else ""
    if counts["fail"]:
        failed_hosts = sorted({c.host for c in report.checks if c.status == "fail"})
        return Text(
            f"NOT READY: {counts['fail']} check(s) failed on {', '.join(failed_hosts)}{warned} "
            f"({counts['pass']} passed, {scope})",
            style="bold red",
        )
    return Text(
        f"READY: {counts['pass']} check(s) passed on {scope}{warned}",
        style="yellow" if counts["warn"] else "bold green",
    )


def render_report(report: DoctorReport, console: Console) -> None:
    """Print the table and the verdict."""
    table = Table(show_header=True, header_style="bold", expand=False, show_lines=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail / fix", overflow="fold")
    for host, checks in _by_host(report.checks).items():
        table.add_section()
        table.add_row(Text(host, style="bold cyan"), "", "")
        skipped = [c for c in checks if c.status == "skip"]
        for c in checks:
            if c.status == "skip":
                continue
            body = Text(c.detail, style=None if c.status == "pass" else STYLE[c.status])
            if c.status in ("warn", "fail") and c.hint:
                body.append(f"\n→ fix: {c.hint}", style="italic")
            table.add_row(Text(MARK[c.status], style=STYLE[c.status]), c.id, body)
        if skipped:
            table.add_row(*_skipped_row(skipped))
    console.print(table)
    if report.bench is not None:
        render_bench(report.bench, console)
    console.print(verdict(report))


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def render_bench(bench: BenchResult, console: Console) -> None:
    """The all-reduce sweep as nccl-tests prints it: size, time, algbw, busbw."""
    table = Table(
        title=f"all-reduce, {bench.backend}, {bench.world_size} ranks on {bench.hosts} host(s) "
        "(busbw = algbw x 2(n-1)/n)",
        title_justify="left",
    )
    for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        table.add_column(col, justify="right")
    for row in bench.rows:
        table.add_row(_size(row.bytes), f"{row.seconds * 1e6:.1f}", f"{row.algbw_gbs:.3f}", f"{row.busbw_gbs:.3f}")
    console.print(table)
    if bench.note:
        console.print(Text(bench.note, style="dim"))
