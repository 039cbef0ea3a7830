"""Rendering of library results: rich tables for people, JSON for programs."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from distlaunch.agent.rankenv import FLIGHT_RECORDER_VARS
from distlaunch.cli.lines import print_clauses, print_command, print_indented, print_value
from distlaunch.contract.hostname import host_port
from distlaunch.contract.plan import Plan, View
from distlaunch.contract.report import REQUEUE_CODE, AttemptReport, FaultCost, Goodput, RankExit, RunReport
from distlaunch.launcher.planning.decisions import PENDING_BACKEND
from distlaunch.launcher.planning.netcards import PLAN_LINE as NETWORK_PLAN_LINE
from distlaunch.placement import describe
from distlaunch.readable import plural, ranges

if TYPE_CHECKING:
    from distlaunch.backends.base import Submission

HOST_ROWS = 32  # the dry run's table shows this many hosts at most: the first ones and the last HOST_ROWS_LAST
HOST_ROWS_LAST = 4


def print_json(model: BaseModel | Plan) -> None:
    """Plain JSON on stdout (no rich markup or wrapping)."""
    print(model.model_dump_json(indent=2))


def print_submission(submission: Submission, json_output: bool) -> None:
    """What a scheduler would be handed (a submitting command's --dry-run): as it reads it, or as JSON."""
    if json_output:
        print(json.dumps(submission.data, indent=2))
    else:
        sys.stdout.write(submission.text)


def _fmt_group(group: Sequence[int], limit: int = 8) -> str:
    """One process group: every rank while few, else its first ranks and last (a dp group of 16,000 ranks is
    ``[0-15999]`` or ``[0,4,8,…,63996] (16000 ranks)``, not a screenful of numbers)."""
    if len(group) <= limit:
        return "[" + ",".join(map(str, group)) + "]"
    if list(group) == list(range(group[0], group[-1] + 1)):
        return f"[{group[0]}-{group[-1]}]"
    return "[" + ",".join(map(str, group[:3])) + f",…,{group[-1]}] ({len(group)} ranks)"


def _fmt_groups(groups: Sequence[Sequence[int]], limit: int = 8) -> str:
    shown = " ".join(_fmt_group(g) for g in groups[:limit])
    return shown + (f" … ({len(groups)} groups)" if len(groups) > limit else "")


def render_plan(plan: Plan, console: Console) -> None:
    """The dry-run view of any backend's plan, drawn as the plan asks (``Plan.view``), secrets hidden."""
    VIEWS[plan.view](plan.masked(), console)


def render_task(plan: Plan, console: Console) -> None:
    """An srun task as the rank it becomes: the variables distlaunch sets, then the program."""
    node = plan.nodes[0]
    rank = node.ranks[0]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in rank.env.items())
    console.print(Text(f"[{node.host} rank {rank.rank}] {env} {shlex.join(rank.argv)}"), soft_wrap=True)


def render_hosts(plan: Plan, console: Console) -> None:
    """One row per host, then the process groups (``plan`` is masked already)."""
    p = plan.parallel
    hosts = plural(plan.nnodes, "host")
    pending = plan.backend == "auto"  # a dry run that contacted no host: they decide at start
    head = f"[bold]Plan[/bold] {plan.job_id}: world size [bold]{plan.world_size}[/bold] on {hosts}"
    master = Text(f"master {host_port(plan.master_addr, plan.master_port)}")  # Text: [v6] is no markup
    print_clauses(console, [Text.from_markup(head), master, *([] if pending else [Text(f"backend {plan.backend}")])])
    if pending:
        print_indented(console, f"backend: from the hosts at start ({PENDING_BACKEND})")
    console.print("  parallel " + str(p).replace(",", " "))
    # where, with what and what each host starts: lines of their own, so that no path is cut by a table cell
    for label, field in (("workdir", "workdir"), ("agent", "agent_python"), ("command", "argv")):
        per_host = {n.host: list(n.ranks[0].argv) if field == "argv" else getattr(n, field) for n in plan.nodes}
        _print_per_host(console, label, per_host)
    visible = {n.host: n.ranks[0].env.get("CUDA_VISIBLE_DEVICES", "(not set)") for n in plan.nodes}
    if set(visible.values()) != {"(not set)"}:  # the GPUs a host's cuda:N devices are
        _print_per_host(console, "CUDA_VISIBLE_DEVICES", visible)
    console.print(_hosts_table(plan))
    print_indented(console, f"placement {plan.cpu_bind}: {describe(plan.cpu_bind)}")
    if plan.preload:
        print_indented(
            console, f"preload (each host imports these once, then forks its ranks): {', '.join(plan.preload)}"
        )
    if plan.nnodes > 1:  # ranks of one host talk over its loopback: no card to choose
        print_indented(console, NETWORK_PLAN_LINE)
    for axis, axis_groups in plan.groups.items():  # the contract's grid order: tp first
        print_indented(console, f"{axis} groups: {_fmt_groups(axis_groups)}")
    if plan.spares is not None:
        spares = ", ".join(h.host for h in plan.spares.hosts) or "none"
        print_indented(
            console,
            f"spares: {spares} (they replace failed hosts; with none left the job shrinks, down to "
            f"{plural(plan.spares.min_nodes, 'host')})",
        )
    user_env = {
        k: v
        for k, v in plan.nodes[0].ranks[0].env.items()
        if not k.startswith(("DISTLAUNCH_", "TORCHELASTIC_", "ROLE_"))
        and k not in _CONTRACT
        and k not in FLIGHT_RECORDER_VARS  # the agent's, as every rank of a watched job has them
    }
    if user_env:
        print_indented(console, "env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in user_env.items()))


VIEWS: dict[View, Callable[[Plan, Console], None]] = {"hosts": render_hosts, "task": render_task}


def _hosts_table(plan: Plan) -> Table:
    """A row per host: its node rank, ranks and devices; a big cluster shows its first hosts and its last."""
    table = Table(show_lines=False)
    table.add_column("host", overflow="fold", ratio=1)  # a host name breaks only when longer than the screen
    table.add_column("node", no_wrap=True)
    table.add_column("ranks", overflow="fold")
    table.add_column("devices", no_wrap=True)
    nodes = plan.nodes
    for i, node in enumerate(nodes):
        if len(nodes) > HOST_ROWS and i == HOST_ROWS - HOST_ROWS_LAST:  # a big cluster: its start and its end
            hidden = nodes[i : len(nodes) - HOST_ROWS_LAST]
            first, last = hidden[0].ranks[0].rank, hidden[-1].ranks[-1].rank
            more = Text(f"{len(hidden)} more hosts (--json lists every one)")
            table.add_row(more, "…", f"{first}-{last}", "…")
        if len(nodes) > HOST_ROWS and HOST_ROWS - HOST_ROWS_LAST <= i < len(nodes) - HOST_ROWS_LAST:
            continue
        table.add_row(
            Text(node.host if node.address == node.host else f"{node.host} ({node.address})"),
            str(node.node_rank),
            ranges([r.rank for r in node.ranks]),
            devices_text([r.device for r in node.ranks]),
        )
    return table


def _print_per_host(console: Console, label: str, per_host: dict[str, str | list[str]]) -> None:
    """One line when every host has the same value, else the label and a line per host; a list is a command."""
    values = list({repr(v): v for v in per_host.values()}.values())
    shown = {label: values[0]} if len(values) == 1 else {f"  {host}:": value for host, value in per_host.items()}
    if len(values) > 1:
        console.print(Text(f"  {label}"))
    for name, value in shown.items():
        if isinstance(value, list):
            print_command(console, value, name)
        else:
            print_value(console, name, value)


def devices_text(devices: list[str]) -> str:
    """A host's devices, short: ``cuda:0-7``, ``cpu``; ``at start`` where its host decides them then."""
    if "auto" in devices:
        return "at start"
    kinds: dict[str, list[int]] = {}
    others: list[str] = []
    for device in devices:
        kind, _, index = device.partition(":")
        if index.isdigit():
            kinds.setdefault(kind, []).append(int(index))
        elif device not in others:
            others.append(device)
    return ", ".join([*(f"{kind}:{ranges(indices)}" for kind, indices in kinds.items()), *others])


_CONTRACT = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "NNODES",
    "CUDA_VISIBLE_DEVICES",
}


# Rows of the failure table: the root cause and what failed right after it. When one rank crashes, its peers
# on every host fail within milliseconds, before the stop reaches them; a 64-rank job would fill a screen.
FAILURE_ROWS = 8


def failure_text(failure: RankExit) -> str:
    """What the rank's ``@record`` error file says (exception and last frame), else the one-line error it
    ended with, else its last lines of output."""
    if failure.error:
        kind, message = failure.error.get("type", ""), failure.error.get("message", "")
        lines = [f"{kind}: {message}" if kind else message, failure.error.get("frame", "")]
        return "\n".join(line for line in lines if line)
    tail = failure.tail[-5:]
    if tail and tail[-1].startswith("error: "):  # a one-line reason last (the engine's): it says it all
        return tail[-1]
    return "\n".join(tail) or "(no output)"


def render_report(report: RunReport, console: Console) -> None:
    """After the job: the root-cause table (earliest failure first) or a one-line success."""
    if report.interrupted:
        how = "not every rank was confirmed stopped" if report.unconfirmed_hosts else "every rank was stopped"
        cause = "interrupted: the terminal was closed (SIGHUP)" if report.interrupted == "SIGHUP" else None
        console.print(
            f"[yellow]{cause or f'interrupted by {report.interrupted}'}[/yellow]: {how} (exit {report.exit_code})"
        )
    saved = next((s for s in reversed(report.saved_on_request) if s.then == "stop"), None)
    if report.stopped_by and report.exit_code == REQUEUE_CODE and saved is not None:
        console.print(f"[yellow]saved and stopped[/yellow] at step {saved.step}, asked by {saved.why} (exit 75)")
        console.print("run the job again, or requeue it, and it resumes there")
    elif report.stopped_by:
        console.print(
            f"[yellow]stopped because {report.stopped_by}[/yellow]: every rank here was stopped (exit {report.exit_code})"
        )
    if report.interrupted:
        for saved in report.saved_on_request:
            if saved.then == "stop":  # the signal's own save: what the next start resumes from
                console.print(f"saved the checkpoint of step {saved.step} before stopping, as asked by {saved.why}")
    if report.lost_work:
        console.print(f"[yellow]lost work[/yellow]: {report.lost_work}")
    if report.hang is not None:
        hung = f" (no progress for {report.hang.timeout_s:g}s): {report.hang.summary}"  # its paths are no markup
        print_indented(console, Text.assemble((f"job {report.job_id} hung", "red"), hung), indent=0)
        if report.hang.folder:
            print_value(console, "every rank's stack:", report.hang.folder, indent="")
    if report.stragglers:
        console.print(
            f"ended {plural(report.stragglers, 'stray process', 'stray processes')} the ranks left behind (DISTLAUNCH_JOB_ID)"
        )
    for found in report.stragglers_found:
        console.print(Text.assemble(("straggler", "yellow"), f": {found.what}"))
    for silent in report.silent_hosts:
        console.print(f"[red]{silent.host} went silent[/red]: no message for {silent.silent_s:.1f}s (exit 3)")
    if report.unconfirmed_hosts:
        console.print(
            f"[red]not confirmed clean[/red]: {', '.join(report.unconfirmed_hosts)} "
            "(their ranks may still run: check with ps there)"
        )
    if report.failures:
        # a line above the table, not its title: a narrow table would wrap a title to its own width
        console.print(Text.assemble((f"job {report.job_id} failed", "red"), " (root cause first)"))
        table = Table()
        table.add_column("rank", no_wrap=True)
        table.add_column("host", overflow="fold", ratio=1)  # a host name breaks only when longer than the screen
        table.add_column("exit", no_wrap=True)
        table.add_column("time", no_wrap=True, justify="right")
        shown, more = report.failures[:FAILURE_ROWS], report.failures[FAILURE_ROWS:]
        for i, f in enumerate(shown):
            exit_text = f"{f.exit_code} ({f.signal})" if f.signal else str(f.exit_code)
            # a host name is data, never rich markup
            table.add_row(str(f.rank), Text(f.host), exit_text, f"{f.time_s:.1f}s", style="bold red" if i == 0 else "")
        console.print(table)
        render_failure_texts(shown, console)
        if more:
            console.print(
                f"{plural(len(more), 'more rank')} failed after those ({ranges([f.rank for f in more])}): "
                f"--json lists every failure, 'distlaunch logs {report.job_id} --rank N' every rank's output"
            )
        explained = next((f for f in report.failures if f.cause), None)
        if explained is not None:
            console.print(Text.assemble(("cause", "bold"), f" (rank {explained.rank}): {explained.cause}"))
        if report.restarts:
            console.print(f"gave up after {plural(report.restarts, 'restart')}")
    elif not report.interrupted and not report.stopped_by and report.hang is None:
        extra = f" after {plural(report.restarts, 'restart')}" if report.restarts else ""
        console.print(
            f"[green]job {report.job_id} finished[/green]: {plural(report.world_size, 'rank')} exited 0 in "
            f"{report.wall_s:.1f}s{extra}"
        )
    render_recovery(report.attempts, report.goodput, console)


def render_failure_texts(failures: list[RankExit], console: Console) -> None:
    """Under the root-cause table, what each rank ended with (its error, else its last lines of output) on lines of
    their own: a traceback's paths fit no table cell at 80 columns. Ranks that ended with the same text share it,
    the root cause's first."""
    texts: dict[str, list[RankExit]] = {}
    for f in failures:
        texts.setdefault(failure_text(f), []).append(f)
    for i, (text, same) in enumerate(texts.items()):
        who = f"rank {same[0].rank}" if len(same) == 1 else f"ranks {ranges([f.rank for f in same])}"
        what = "error" if same[0].error or text.startswith("error: ") else "last output"
        console.print(Text(f"{who}, its {what}:", style="bold red" if i == 0 else "bold"))
        # A rank's output is data, never rich markup: gloo prints "[/path/x.cc:12]".
        print_indented(console, Text(text))


def render_recovery(attempts: list[AttemptReport], goodput: Goodput | None, console: Console) -> None:
    """A job that restarted: each attempt (its hosts, layout, what changed and how it ended), then what each
    fault cost and the job's goodput."""
    if len(attempts) > 1:
        console.print("[bold]attempts[/bold]")
        for a in attempts:
            change = "".join(f"; -{host} ({why})" for host, why in a.dropped.items())
            change += "".join(f"; +{host}" for host in a.added)
            steps = f", steps {a.first_step}-{a.last_step}" if a.first_step is not None else ""
            print_indented(console, Text(f"{a.restart}: {', '.join(a.hosts)} ({a.layout}){change}{steps}: {a.ended}"))
    if goodput is None:
        return
    for fault in goodput.faults:
        print_indented(console, Text(f"lost {fault.lost_s:.1f}s to {fault.fault}: {cost_parts(fault)}"))
    if goodput.ettr is not None:
        console.print(
            f"goodput: {goodput.productive_s:.1f}s of {goodput.wall_s:.1f}s were kept training steps "
            f"(ETTR {goodput.ettr:.0%})"
        )


def cost_parts(fault: FaultCost) -> str:
    """'detection 0.1s + stopping 1.0s + restart 2.1s + start-up 3.0s + 4 steps recomputed 0.8s'."""
    parts = [("detection", fault.detection_s), ("stopping", fault.stopping_s), ("restart", fault.restart_s)]
    parts.append(("start-up", fault.startup_s))
    text = [f"{name} {seconds:.1f}s" for name, seconds in parts if seconds is not None]
    if fault.recomputed_steps is not None and fault.recomputed_s is not None:
        text.append(f"{plural(fault.recomputed_steps, 'step')} recomputed {fault.recomputed_s:.1f}s")
    return " + ".join(text)
