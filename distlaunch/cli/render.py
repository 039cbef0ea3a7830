"""Rendering of library results: rich tables for people, JSON for programs."""

from __future__ import annotations

import shlex

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from distlaunch.contract.hostname import host_port
from distlaunch.contract.report import REQUEUE_CODE, AttemptReport, FaultCost, Goodput, RankExit, RunReport
from distlaunch.launcher.plan import LaunchPlan
from distlaunch.launcher.stacks import ranges
from distlaunch.slurm.env import SlurmRank

HOST_ROWS = 32  # the dry run's table shows this many hosts at most: the first ones and the last HOST_ROWS_LAST
HOST_ROWS_LAST = 4


def print_json(model: BaseModel) -> None:
    """Plain JSON on stdout (no rich markup or wrapping)."""
    print(model.model_dump_json(indent=2))


def _fmt_group(group: list[int], limit: int = 8) -> str:
    """One process group: every rank while few, else its first ranks and last (a dp group of 16,000 ranks is
    ``[0-15999]`` or ``[0,4,8,…,63996] (16000 ranks)``, not a screenful of numbers)."""
    if len(group) <= limit:
        return "[" + ",".join(map(str, group)) + "]"
    if group == list(range(group[0], group[-1] + 1)):
        return f"[{group[0]}-{group[-1]}]"
    return "[" + ",".join(map(str, group[:3])) + f",…,{group[-1]}] ({len(group)} ranks)"


def _fmt_groups(groups: list[list[int]], limit: int = 8) -> str:
    shown = " ".join(_fmt_group(g) for g in groups[:limit])
    return shown + (f" … ({len(groups)} groups)" if len(groups) > limit else "")


def masked(plan: BaseModel) -> BaseModel:
    """A plan safe to print (secret-looking values hidden), whatever backend made it."""
    return plan.masked() if isinstance(plan, (LaunchPlan, SlurmRank)) else plan


def render_plan(plan: BaseModel, console: Console) -> None:
    """The dry-run view of any backend's plan."""
    if isinstance(plan, SlurmRank):
        render_task(plan.masked(), console)
    else:
        render_launch_plan(plan, console)


def render_task(rank: SlurmRank, console: Console) -> None:
    """An srun task as the rank it becomes: the variables distlaunch sets, then the program."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in rank.env.items())
    console.print(Text(f"[{rank.node} rank {rank.rank}] {env} {shlex.join(rank.argv)}"), soft_wrap=True)


def render_launch_plan(plan: LaunchPlan, console: Console) -> None:
    """The dry-run view: one row per host, then the process groups."""
    plan = plan.masked()
    p = plan.parallel
    hosts = f"{plan.nnodes} host" + ("s" if plan.nnodes > 1 else "")
    console.print(
        f"[bold]Plan[/bold] {plan.job_id}: world size [bold]{plan.world_size}[/bold] on {hosts}, "
        f"master {escape(host_port(plan.master_addr, plan.master_port))}, backend {plan.backend}"  # [v6] is no markup
    )
    console.print("  parallel " + str(p).replace(",", " "))
    for label, field in (("workdir", "workdir"), ("agent", "agent_python")):  # where and with what each host starts
        per_host = {n.host: getattr(n, field) for n in plan.nodes}
        values = set(per_host.values())
        shown = values.pop() if len(values) == 1 else "; ".join(f"{h}: {v}" for h, v in per_host.items())
        console.print(Text(f"  {label} {shown}"))
    table = Table(show_lines=False)
    for col in ("host", "node", "ranks", "devices", "command"):
        table.add_column(col, overflow="fold")
    for i, node in enumerate(plan.nodes):
        if len(plan.nodes) > HOST_ROWS and i == HOST_ROWS - HOST_ROWS_LAST:  # a big cluster: its start and its end
            hidden = plan.nodes[i : len(plan.nodes) - HOST_ROWS_LAST]
            first, last = hidden[0].ranks[0].rank, hidden[-1].ranks[-1].rank
            table.add_row("…", "…", f"{first}-{last}", "", f"{len(hidden)} more hosts (--json lists every one)")
        if len(plan.nodes) > HOST_ROWS and HOST_ROWS - HOST_ROWS_LAST <= i < len(plan.nodes) - HOST_ROWS_LAST:
            continue
        ranks = [r.rank for r in node.ranks]
        devices = sorted({r.device for r in node.ranks})
        cvd = node.ranks[0].env.get("CUDA_VISIBLE_DEVICES")
        dev = ", ".join(devices) + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd else "")
        table.add_row(
            Text(node.host if node.address == node.host else f"{node.host} ({node.address})"),
            str(node.node_rank),
            ranges(ranks),
            dev,
            Text(shlex.join(node.ranks[0].argv)),  # the user's arguments are data, not rich markup
        )
    console.print(table)
    for axis in ("tp", "dp", "pp"):
        console.print(f"  {axis} groups: {_fmt_groups(plan.groups[axis])}")
    if plan.spares is not None:
        spares = ", ".join(h.host for h in plan.spares.hosts) or "none"
        console.print(
            Text(
                f"  spares: {spares} (they replace failed hosts; with none left the job shrinks, down to "
                f"{plural(plan.spares.min_nodes, 'host')})"
            )
        )
    user_env = {
        k: v
        for k, v in plan.nodes[0].ranks[0].env.items()
        if not k.startswith(("DISTLAUNCH_", "TORCHELASTIC_", "ROLE_")) and k not in _CONTRACT
    }
    if user_env:
        console.print("  env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in user_env.items()), markup=False)


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


def plural(count: int, noun: str) -> str:
    """'1 rank', '4 ranks'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


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
        console.print(
            f"[red]job {report.job_id} hung[/red] (no progress for {report.hang.timeout_s:g}s): {report.hang.summary}"
        )
        if report.hang.folder:
            console.print(f"every rank's stack: {report.hang.folder}")
    if report.stragglers:
        console.print(f"ended {report.stragglers} stray process(es) the ranks left behind (DISTLAUNCH_JOB_ID)")
    for found in report.stragglers_found:
        console.print(Text.assemble(("straggler", "yellow"), f": {found.what}"), soft_wrap=True)
    for silent in report.silent_hosts:
        console.print(f"[red]{silent.host} went silent[/red]: no message for {silent.silent_s:.1f}s (exit 3)")
    if report.unconfirmed_hosts:
        console.print(
            f"[red]not confirmed clean[/red]: {', '.join(report.unconfirmed_hosts)} "
            "(their ranks may still run: check with ps there)"
        )
    if report.failures:
        table = Table(title=f"[red]job {report.job_id} failed[/red] (root cause first)", show_lines=True)
        for col in ("rank", "host", "exit", "time", "error / last output"):
            table.add_column(col, overflow="fold")
        shown, more = report.failures[:FAILURE_ROWS], report.failures[FAILURE_ROWS:]
        for i, f in enumerate(shown):
            exit_text = f"{f.exit_code} ({f.signal})" if f.signal else str(f.exit_code)
            style = "bold red" if i == 0 else ""
            # A rank's output and a host name are data, never rich markup: gloo prints "[/path/x.cc:12]".
            table.add_row(str(f.rank), Text(f.host), exit_text, f"{f.time_s:.1f}s", Text(failure_text(f)), style=style)
        console.print(table)
        if more:
            console.print(
                f"{plural(len(more), 'more rank')} failed after those ({ranges([f.rank for f in more])}): "
                "--json lists every failure, --log-dir keeps every rank's output"
            )
        explained = next((f for f in report.failures if f.cause), None)
        if explained is not None:
            console.print(Text.assemble(("cause", "bold"), f" (rank {explained.rank}): {explained.cause}"))
        if report.restarts:
            console.print(f"gave up after {report.restarts} restart(s)")
    elif not report.interrupted and not report.stopped_by and report.hang is None:
        extra = f" after {report.restarts} restart(s)" if report.restarts else ""
        console.print(
            f"[green]job {report.job_id} finished[/green]: {plural(report.world_size, 'rank')} exited 0 in "
            f"{report.wall_s:.1f}s{extra}"
        )
    render_recovery(report.attempts, report.goodput, console)


def render_recovery(attempts: list[AttemptReport], goodput: Goodput | None, console: Console) -> None:
    """A job that restarted: each attempt (its hosts, layout, what changed and how it ended), then what each
    fault cost and the job's goodput."""
    if len(attempts) > 1:
        console.print("[bold]attempts[/bold]")
        for a in attempts:
            change = "".join(f"; -{host} ({why})" for host, why in a.dropped.items())
            change += "".join(f"; +{host}" for host in a.added)
            steps = f", steps {a.first_step}-{a.last_step}" if a.first_step is not None else ""
            console.print(
                Text(f"  {a.restart}: {', '.join(a.hosts)} ({a.layout}){change}{steps}: {a.ended}"), soft_wrap=True
            )
    if goodput is None:
        return
    for fault in goodput.faults:
        console.print(Text(f"  lost {fault.lost_s:.1f}s to {fault.fault}: {cost_parts(fault)}"), soft_wrap=True)
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
