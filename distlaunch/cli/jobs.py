"""``distlaunch jobs``, ``status``, ``logs``, ``stop`` and ``stacks``: the job registry, read back (docs/jobs.md)."""

from __future__ import annotations

import re
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from distlaunch.backends.base import LastKnown
from distlaunch.backends.output import Note
from distlaunch.backends.recorded import find_job, list_jobs, read_lines, stop_job
from distlaunch.backends.registry import of_record
from distlaunch.cli.hosts_render import gpus_line
from distlaunch.cli.options import refused
from distlaunch.cli.render import print_json, render_recovery, render_report
from distlaunch.contract.inventory import HostInventory
from distlaunch.contract.report import RunReport
from distlaunch.jobs.store import FINAL_STATES, RECORD, JobRecord, Unreadable, dumps, jobs_dir
from distlaunch.readable import plural, ranges

RECENT = 20  # what 'distlaunch jobs' shows without --all
_STATE_STYLE = {"pending": "yellow", "running": "cyan", "succeeded": "green", "failed": "red", "lost": "magenta"}

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
JobId = Annotated[str, typer.Argument(help="A job id, or a unique prefix of one (dl-3f9a…).", show_default=False)]


def jobs(
    running: Annotated[bool, typer.Option("--running", help="Only jobs that are still running.")] = False,
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help=f"Every job (default: the {RECENT} newest).")] = False,
    json_output: Json = False,
) -> int:
    """List jobs, newest first: id, backend, hosts, ranks, state, age, exit code."""
    records = list_jobs()
    good = [r for r in records if isinstance(r, JobRecord) and (not running or r.state == "running")]
    # A damaged record has no age to rank it by and wants a look: every one is listed, after the jobs
    # (not with --running: whether it runs is unknown).
    bad = [] if running else [r for r in records if isinstance(r, Unreadable)]
    shown = (good if all_jobs else good[:RECENT]) + bad
    if json_output:
        print(dumps(shown))
        return 0
    console = Console()
    if not shown:
        console.print("no jobs" + (" running" if running else "") + " (distlaunch run and train record theirs)")
        return 0
    render_jobs(shown, console)
    return 0


def status(job: JobId, json_output: Json = False) -> int:
    """Show one job in full: command, plan, state per host, restarts, the root cause when it failed."""
    record = find_job(job)
    if json_output:
        print_json(record)
        return 0
    render_status(record, Console())
    return 0


def stop(
    job: JobId,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait for the job to confirm its end.", min=1),
    ] = 60.0,
    checkpoint: Annotated[
        bool,
        typer.Option(
            "--checkpoint",
            help="Save first: every rank saves a checkpoint at its next step, then the job stops and ends with exit 75"
            " (start it again and it resumes there).",
        ),
    ] = False,
    json_output: Json = False,
) -> int:
    """Stop a running job like Ctrl-C: every rank on every host gets SIGTERM, a grace period, then SIGKILL.

    Exit code: 0 once the job has stopped, 1 when it did not confirm its end within --timeout (it goes on stopping)
    or, with --checkpoint, saved no checkpoint, 2 for a job that is unknown or not running, 3 when kubectl or Slurm
    failed."""
    # A scheduler that cannot be asked does not make the job stopped: its own stop command is tried (and its
    # failure said, exit 3).
    record = stop_job(find_job(job, last_known_ok=True), timeout, checkpoint)
    if json_output:
        print_json(record)
    else:
        code = "" if record.exit_code is None else f" (exit {record.exit_code})"
        Console().print(f"job {record.job_id} {record.state}{code}", highlight=False)
    return 0


# -n counts the ranks per host in every command that starts ranks; here it would be another number, tail's
TailNot = refused(
    "-n",
    why="-n is the ranks per host in distlaunch's other commands, not a line count",
    fix="give --tail N for the last N lines (-r/--rank R picks ranks)",
)


def logs(
    job: JobId,
    rank: Annotated[
        list[int] | None, typer.Option("--rank", "-r", help="Only this rank's lines (repeat for several).")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", metavar="N", help="Only the last N lines.", min=0)] = None,
    tail_as_n: TailNot = None,
    stderr: Annotated[
        bool, typer.Option("--stderr", help="Only the ranks' stderr lines (and distlaunch's notices).")
    ] = False,
) -> int:
    """Print a job's rank-prefixed output (its rank logs, a detached job's output, a Slurm job's output file, a Kubernetes job's pods)."""
    record = find_job(job, last_known_ok=True)  # a Slurm job's output file is here even when slurmctld is not
    lines = read_lines(record, follow, set(rank or []), tail, stderr, on_end=_say_if_lost)
    for line in lines:
        if isinstance(line, Note):
            sys.stdout.flush()
            sys.stderr.write(f"distlaunch: {line}\n")
            continue
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    return 0


def _say_if_lost(end: JobRecord) -> None:
    """``logs --follow`` of a job that ends lost: its output just stops, so say why (exit 0, as for any end)."""
    if end.state == "lost":
        sys.stdout.flush()
        sys.stderr.write(
            f"distlaunch: job {end.job_id} was lost: {_lost_why(end)}; its output ends here "
            f"(see 'distlaunch status {end.job_id}')\n"
        )


def stacks(
    job: JobId,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", help="Seconds to wait for the job's launcher to answer.", min=1),
    ] = 30.0,
    json_output: Json = False,
) -> int:
    """Show where every rank of a running job is now (grouped stacks); the job keeps running.

    A request file in the job's folder asks the job's launcher, which takes it on its next turn (no signal
    reaches the job): it asks every agent for its ranks' Python stacks (py-spy, else faulthandler) as on a hang, and
    writes them to a new stacks-N folder in the job's folder.

    Exit code: 0 when the stacks are printed, 1 when the launcher did not answer within --timeout, 2 for a job that
    is unknown or not running here (ended, lost, another machine, Slurm or Kubernetes)."""
    record = find_job(job, last_known_ok=True)
    snapshot = of_record(record).stacks(record, timeout)  # refused for Slurm and k8s jobs
    if json_output:
        print_json(snapshot)
        return 0
    console = Console()
    console.print(f"job {snapshot.job_id}: {snapshot.summary}", highlight=False, soft_wrap=True, markup=False)
    console.print(f"full stacks: {snapshot.folder}", highlight=False, soft_wrap=True, markup=False)
    return 0


def render_jobs(records: list[JobRecord | Unreadable], console: Console) -> None:
    """One row per job; only HOSTS may wrap, so an id is never cut. Why a record is unreadable goes below."""
    now = time.time()
    rows = [
        [Text(r.job_id), Text(), Text(), Text(), Text("unreadable", style="yellow"), Text(), Text()]
        if isinstance(r, Unreadable)
        else [
            Text(r.job_id),
            Text(r.backend),
            Text(_hosts(r.hosts)),
            Text(str(r.world_size)),
            # the last known state, marked: its scheduler could not be asked now (why: below the table)
            Text(r.state + "?", style="yellow")
            if isinstance(r, LastKnown)
            else Text(r.state, style=_STATE_STYLE.get(r.state, "")),
            Text(_age(now - r.created_at)),
            Text("" if r.exit_code is None else str(r.exit_code)),
        ]
        for r in records
    ]
    table = Table(box=None, pad_edge=False)
    for i, col in enumerate(("JOB", "BACKEND", "HOSTS", "RANKS", "STATE", "AGE", "EXIT")):
        widest = max(len(col), *(row[i].cell_len for row in rows))
        table.add_column(col, no_wrap=col != "HOSTS", min_width=None if col == "HOSTS" else widest)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for r in records:
        if isinstance(r, LastKnown):
            console.print(
                f"{r.job_id}: state unknown (last known: {r.state}): {r.unknown}",
                highlight=False,
                soft_wrap=True,
                markup=False,
            )
    unreadable = [r for r in records if isinstance(r, Unreadable)]
    for r in unreadable:
        console.print(f"{r.job_id}: {r.problem}", highlight=False, soft_wrap=True, markup=False)
    if unreadable:
        console.print(
            f"(each job's folder is under {jobs_dir()}: repair its {RECORD}, or remove the folder to forget the job)",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )


def render_status(r: JobRecord, console: Console) -> None:
    """The record as a few labelled lines, the hosts' ranks, then the root-cause table of a failed job."""
    style = _STATE_STYLE.get(r.state, "bold")
    ended = f", ended {_clock(r.ended_at)} ({r.ended_at - r.created_at:.1f}s)" if r.ended_at else ""
    console.print(f"[bold]{r.job_id}[/bold]  [{style}]{r.state}[/{style}]", highlight=False)
    lines = {
        "command": " ".join(r.command) or "(not recorded)",
        "cwd": r.cwd,
        "backend": r.backend,
        "ranks": f"{r.world_size} on {_places(r)}, {r.plan.get('parallel', {}).get('dp', '?')}-way data "
        f"parallel ({_comm_backend(r.plan.get('backend'))})",
        "time": f"started {_clock(r.created_at)}{ended}",
        "exit code": "" if r.exit_code is None else str(r.exit_code),
        "restarts": str(r.restarts),
        "logs": r.rank_logs or r.log_dir or "",
        "error": r.error or "",
        "straggler": "; ".join(s.what for s in r.stragglers_found),
    }
    if r.native_id and r.backend == "k8s":
        lines["k8s job"] = f"job/{r.native_id}" + (f" in namespace {r.namespace}" if r.namespace else "")
    elif r.native_id:
        lines["slurm job"] = r.native_id
        lines["output"] = r.output or ""
    if r.state == "lost" and r.owner is not None:
        lines["state"] = _lost_why(r)
    for key, value in lines.items():
        if value:
            console.print(f"  {key:<10} {value}", highlight=False, soft_wrap=True, markup=False)
    table = Table(box=None, pad_edge=False)
    reported = (r.plan.get("decisions") or {}).get("inventories") or {}  # what each host said of itself at start
    for col in ("HOST", "NODE", "RANKS", "STATE", *(["GPUS", "CPUS"] if reported else [])):
        table.add_column(col)
    failed = {f["rank"]: f for f in (r.report or {}).get("failures", [])}
    for node in r.plan.get("nodes", []):
        ranks = [rank["rank"] for rank in node["ranks"]]
        bad = [f"rank {k} exit {failed[k]['exit_code']}" for k in ranks if k in failed]
        shown = ", ".join(bad) or node.get("state") or _node_state(r.state, bool(failed))  # a pod's own, for k8s
        facts = HostInventory.of(reported.get(node["host"])) if reported else None
        hardware = [gpus_line(facts), _cpus(facts)] if facts else ["?", "?"] if reported else []
        table.add_row(Text(node["host"]), str(node["node_rank"]), ranges(ranks) if ranks else "-", shown, *hardware)
    if table.row_count:  # none while a Slurm or Kubernetes job waits for its nodes or pods
        console.print(table)
    if r.report is not None and r.state in FINAL_STATES and r.state != "succeeded":
        render_report(RunReport.model_validate(r.report), console)  # its attempts and goodput included
    elif r.attempts:
        render_recovery(r.attempts, r.goodput, console)


def _cpus(facts: HostInventory) -> str:
    """'64 in 2 NUMA nodes': a host's CPUs, short, for a table of hosts (``distlaunch hosts`` lists them)."""
    nodes = f" in {plural(len(facts.numa_nodes), 'NUMA node')}" if len(facts.numa_nodes) > 1 else ""
    return f"{facts.cpus if facts.cpus is not None else '?'}{nodes}"


def _places(r: JobRecord) -> str:
    """'2 hosts', or a scheduler's '2 nodes' / '2 pods': counted from the per-node plan, else the node
    count the job asked for (a Slurm or Kubernetes job before it has its nodes)."""
    unit = {"slurm": "node", "k8s": "pod"}.get(r.backend)
    if unit is None:
        return plural(len(r.hosts), "host")
    count = len(r.plan.get("nodes") or []) or r.plan.get("nnodes")
    if not count:  # a record written before its scheduler was asked: hosts reads ["(2 nodes)"]
        label = re.fullmatch(r"\((\d+) (?:node|pod)s?\)", r.hosts[0]) if len(r.hosts) == 1 else None
        count = int(label.group(1)) if label else len(r.hosts)
    return plural(count, unit)


def _lost_why(r: JobRecord) -> str:
    if r.owner is not None:
        return f"the process that ran the job (pid {r.owner.pid} on {r.owner.hostname}) is gone"
    return r.error or "its scheduler no longer knows it"


def _comm_backend(backend: str | None) -> str:
    # "slurm" and "k8s": records of earlier versions, which named the scheduler there
    if backend in (None, "auto", "slurm", "k8s"):
        return "backend chosen on the nodes: nccl with GPUs, else gloo"
    return f"backend {backend}"


def _node_state(job_state: str, ranks_known: bool) -> str:
    """A node's state when no rank of it is named in the report: stopped after another rank's failure, or, when
    no rank's failure is known (a batch job: its scheduler tells only the job's end), the job's own state."""
    if job_state == "failed" and not ranks_known:
        return "failed"
    return {"succeeded": "exited 0", "failed": "stopped", "interrupted": "stopped"}.get(job_state, job_state)


def _hosts(hosts: list[str], limit: int = 3) -> str:
    return ",".join(hosts[:limit]) + (f",+{len(hosts) - limit}" if len(hosts) > limit else "")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
