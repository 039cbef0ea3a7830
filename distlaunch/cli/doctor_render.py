"""The doctor's report for people: one rich table grouped by host (green / yellow / red, the hint under
each problem, skipped checks folded into one line) and a one-line verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from distlaunch.doctor.model import BenchResult, Check, DoctorReport
from distlaunch.readable import plural

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
    return Text("skip", style="dim"), Text(plural(len(skipped), "check"), style="dim"), Text(text, style="dim")


def verdict(report: DoctorReport) -> Text:
    """One line: how many checks failed or warned, on how many hosts."""
    counts = {s: sum(c.status == s for c in report.checks) for s in STYLE}
    hosts = len({c.host for c in report.checks if c.host != "(local)"})
    scope = plural(hosts, "host")
    warned = f", {plural(counts['warn'], 'warning')}" if counts["warn"] else ""
    if counts["fail"]:
        failed_hosts = sorted({c.host for c in report.checks if c.status == "fail"})
        return Text(
            f"NOT READY: {plural(counts['fail'], 'check')} failed on {', '.join(failed_hosts)}{warned} "
            f"({counts['pass']} passed, {scope})",
            style="bold red",
        )
    return Text(
        f"READY: {plural(counts['pass'], 'check')} passed on {scope}{warned}",
        style="yellow" if counts["warn"] else "bold green",
    )


def render_report(report: DoctorReport, console: Console) -> None:
    """Print a table per host under its name, then the verdict. The tables share their columns' widths, so
    they read as one; a host name is a heading of its own, never a cell that widens a column (an FQDN would
    leave the details a sliver at 80 columns)."""
    by_host = _by_host(report.checks)
    rows = {host: _rows(checks) for host, checks in by_host.items()}
    marks = max(len("status"), *(len(mark.plain) for host_rows in rows.values() for mark, _, _ in host_rows))
    ids = max(len(check_id.plain) for host_rows in rows.values() for _, check_id, _ in host_rows)
    widest = max(
        len(line) for host_rows in rows.values() for _, _, body in host_rows for line in body.plain.split("\n")
    )
    width = min(console.width, marks + ids + widest + 10)  # 10: the borders and padding of three columns
    for i, (host, host_rows) in enumerate(rows.items()):
        console.print(Text(host, style="bold cyan"))
        table = Table(header_style="bold", show_header=i == 0, width=width)
        table.add_column("status", no_wrap=True, width=marks)
        table.add_column("check", no_wrap=True, width=ids)
        table.add_column("detail / fix", overflow="fold", ratio=1)
        for row in host_rows:
            table.add_row(*row)
        console.print(table)
    if report.bench is not None:
        render_bench(report.bench, console)
    console.print(verdict(report))


def _rows(checks: list[Check]) -> list[tuple[Text, Text, Text]]:
    """One row per check that ran, the hint under each problem; the skipped ones folded into one row."""
    rows = []
    for c in checks:
        if c.status == "skip":
            continue
        body = Text(c.detail, style=None if c.status == "pass" else STYLE[c.status])
        if c.status in ("warn", "fail") and c.hint:
            body.append(f"\n→ fix: {c.hint}", style="italic")
        rows.append((Text(MARK[c.status], style=STYLE[c.status]), Text(c.id), body))
    skipped = [c for c in checks if c.status == "skip"]
    if skipped:
        rows.append(_skipped_row(skipped))
    return rows


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


def render_bench(bench: BenchResult, console: Console) -> None:
    """The all-reduce sweep as nccl-tests prints it: size, time, algbw, busbw."""
    table = Table(
        title=f"all-reduce, {bench.backend}, {plural(bench.world_size, 'rank')} on {plural(bench.hosts, 'host')} "
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
