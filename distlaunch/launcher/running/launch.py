"""The launcher's front door: options → plan → execution, for ``run`` and ``train`` alike."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distlaunch import interrupts
from distlaunch.contract.layout import LayoutSpec
from distlaunch.contract.options import ExecOptions, LaunchOptions
from distlaunch.contract.report import RunReport
from distlaunch.contract.sink import Sink
from distlaunch.errors import DistlaunchError, ExitCode, HostError, Interrupted, UsageError
from distlaunch.jobs.inventories import cache_key, forget, remember
from distlaunch.launcher.elastic.healing import PREFLIGHT_TIMEOUT_S, Healing, Pool, split_spares
from distlaunch.launcher.planning.decisions import Decisions, decide, local_inventory
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.plan import LaunchPlan, LaunchSpec, Spares, build_plan
from distlaunch.launcher.planning.program import check_local_program, check_workdir, program_label, start_error
from distlaunch.launcher.planning.spec import (
    check_master_port,
    is_local_host,
    is_loopback,
    make_spec,
    nproc_rule,
    resolve_hosts,
)
from distlaunch.launcher.running.attempt import CannotStart
from distlaunch.launcher.running.execute import Progress, execute
from distlaunch.launcher.running.network import with_network
from distlaunch.launcher.running.portlock import hold_port
from distlaunch.launcher.running.transport import LocalAgent
from distlaunch.launcher.supervising.recovery import Connect, Recovery
from distlaunch.launcher.supervising.requests import JobRequests, StopRequest, signal_number
from distlaunch.placement import check_sets
from distlaunch.readable import plural, ranges

if TYPE_CHECKING:
    from distlaunch.remote.session import RemoteHosts


def host_addresses(opts: LaunchOptions, hosts: list[HostSlots]) -> dict[str, str]:
    """Remote hosts' addresses as the other hosts reach them: the ssh_config HostName, not a local alias."""
    remote = [h.host for h in hosts if not is_local_host(h.host)]
    if not remote:
        return {}
    from distlaunch.remote.sshconfig import resolve_targets  # paramiko: only paid when a host is remote

    return {alias: target.hostname for alias, target in resolve_targets(remote, opts.ssh_config).items()}


def spec_for(
    opts: LaunchOptions, workdir: str | None = None, flight_recorder: bool = False, decisions: Decisions | None = None
) -> LaunchSpec:
    """Resolve the options (the hostfile read once, ssh_config only when a host is remote). With
    ``--nnodes MIN:MAX`` the job starts on the first MAX hosts; the rest are its spares."""
    hosts = resolve_hosts(opts)
    addresses = host_addresses(opts, hosts)
    if opts.nodes is None:
        return make_spec(opts, hosts, addresses, workdir, flight_recorder, decisions)
    active, spares = split_spares(hosts, opts.nodes, opts.hostfile)
    spec = make_spec(opts, active, addresses, workdir, flight_recorder, decisions)
    return spec.model_copy(update={"spares": Spares(min_nodes=opts.nodes.min_nodes, hosts=spares)})


def plan_for(
    opts: LaunchOptions, workdir: str | None = None, flight_recorder: bool = False, decisions: Decisions | None = None
) -> LaunchPlan:
    """Resolve the options and build the plan (reads the hostfile and ssh_config; starts nothing)."""
    plan = build_plan(spec_for(opts, workdir, flight_recorder, decisions))
    check_local_script(plan, opts)  # a dry-run checks what a run checks
    check_cpu_bind(plan)
    if starts_rank0_here(plan):
        check_master_port(opts, plan.master_port)
    return plan


def all_local(plan: LaunchPlan) -> bool:
    return all(node.local for node in plan.nodes)


def check_local_script(plan: LaunchPlan, opts: LaunchOptions) -> None:
    """Where ranks run here, their working directory, Python and program must be usable here (remote hosts
    have their own filesystem: their agents check them before any rank starts, see supervising/gate.py)."""
    local = next((node for node in plan.nodes if node.local), None)
    if local is not None:
        check_local_program(opts, local.workdir)


def check_cpu_bind(plan: LaunchPlan) -> None:
    """A --cpu-bind list, as far as the launcher can know it: a set for every local rank of every host, and on
    this machine only CPUs its ranks may use (remote hosts check theirs before any rank starts)."""
    for node in plan.nodes:
        usable = sorted(os.sched_getaffinity(0)) if node.local else None  # a local agent inherits ours
        try:
            check_sets(plan.cpu_bind, len(node.ranks), usable)
        except UsageError as exc:
            exc.message += f" on {node.host}"
            raise


def check_local_workdir(plan: LaunchPlan) -> None:
    """Ranks that start here start in --workdir: it must be a folder here (remote hosts check theirs in preflight)."""
    workdir = next((node.workdir for node in plan.nodes if node.local and node.workdir), "")
    if workdir:
        check_workdir(workdir)


def check_shown_local_ranks(plan: LaunchPlan, shown: list[int] | None) -> None:
    """--local-ranks-filter must name local ranks some host runs, or their output would never appear."""
    most = max(len(node.ranks) for node in plan.nodes)
    absent = sorted({r for r in shown or [] if r >= most})
    if absent:
        raise UsageError(
            f"--local-ranks-filter names {'local rank' if len(absent) == 1 else 'local ranks'} {ranges(absent)}, but no host "
            f"runs more than {plural(most, 'rank')} (local ranks 0-{most - 1})",
            "name local ranks that exist, e.g. 0",
        )


def make_connect(opts: LaunchOptions, remote: RemoteHosts | None = None) -> Connect:
    """Local hosts get a child-process agent; remote hosts an agent over SSH (connections from ``remote``)."""

    def connect(node, events):
        if node.local:
            return LocalAgent(node.node_rank, node.host, events)
        if remote is None or node.host not in remote:
            raise HostError(
                f"host {node.host!r} was not connected before the launch", "start multi-host jobs through launch()"
            )
        return remote.agent(node.node_rank, node.host, events)

    return connect


def check_launch(plan: LaunchPlan, opts: LaunchOptions) -> None:
    """What must hold on this machine right before a plan starts (foreground or detached): exit 2 otherwise."""
    check_local_workdir(plan)
    check_local_script(plan, opts)
    check_cpu_bind(plan)
    if starts_rank0_here(plan):
        check_master_port(opts, plan.master_port)


@dataclass
class LaunchContext:
    """What one launch hands down to its attempts: the plan as first built and the options it came from, how
    the job is supervised, where its output goes, what commands ask of it (``requests``), a stop distlaunch
    itself may ask (``stop_request``: another node of a per-node job failed), and who hears of each attempt
    (``progress``: the job record)."""

    plan: LaunchPlan
    opts: LaunchOptions
    exec_opts: ExecOptions
    sink: Sink
    stop_request: StopRequest | None = None
    requests: JobRequests | None = None
    progress: Progress | None = None
    replanned: Callable[[LaunchPlan], None] | None = None  # the job record, when the hosts' decisions change the plan

    def adopt(self, plan: LaunchPlan) -> None:
        """Go on with ``plan``, as the hosts decided it; the job record hears of it where it changed."""
        if plan is not self.plan and self.replanned is not None:
            self.replanned(plan)
        self.plan = plan

    def execute(self, plan: LaunchPlan, connect: Connect, recovery: Recovery | None = None) -> RunReport:
        """Run ``plan``'s attempts, reaching its hosts through ``connect``."""
        x = self.exec_opts
        return execute(plan, x, self.sink, connect, self.requests, self.stop_request, recovery, self.progress)


def launch(
    plan: LaunchPlan,
    opts: LaunchOptions,
    exec_opts: ExecOptions,
    sink: Sink,
    command: list[str] | None = None,
    stop_request: StopRequest | None = None,
) -> RunReport:
    """Execute a plan built from ``opts``, keep its job record (``distlaunch jobs``) and report how it ended;
    ``stop_request``: a stop distlaunch itself may ask of the running job (``running/node.py``)."""
    with master_port_held(plan, opts):
        check_launch(plan, opts)
        return _recorded(LaunchContext(plan, opts, exec_opts, sink, stop_request), command or [])


def starts_rank0_here(plan: LaunchPlan) -> bool:
    """Whether this launch starts rank 0, whose store listens on the master port, on this machine. In the
    per-node mode only node 0's launch does; the other nodes' launches use its port."""
    first = plan.nodes[0]
    return first.node_rank == 0 and (first.local or is_loopback(plan.master_addr))


def master_port_held(plan: LaunchPlan, opts: LaunchOptions) -> AbstractContextManager:
    """A fixed master port is held for the whole job (launcher/running/portlock.py) where rank 0 starts."""
    if opts.master_port == "auto" or not starts_rank0_here(plan):
        return nullcontext()
    return hold_port(plan.master_port, plan.job_id)


def _recorded(ctx: LaunchContext, command: list[str]) -> RunReport:
    from distlaunch.jobs.store import job_folder
    from distlaunch.launcher.running.journal import Journal

    plan, x = ctx.plan, ctx.exec_opts
    backend = "local" if all_local(plan) else "ssh"
    log_dir = str(x.log_dir) if x.log_dir is not None else None
    # the save signal is trapped before the record exists: a signal that finds the record finds it trapped
    with JobRequests(
        save_signal=signal_number(x.save_signal), forward=tuple(signal_number(n) for n in x.forward_signals)
    ) as requests:
        journal = None
        try:
            with interrupts.held():  # the record is begun whole; a signal meanwhile is raised once it is
                journal = Journal.begin(plan, backend, command, log_dir, ctx.sink.notice)
                requests.folder = None if journal.broken else job_folder(plan.job_id)
                ctx.requests, ctx.progress, ctx.replanned = requests, journal.progress, journal.replanned
            report = _launch(ctx)
            with interrupts.held(then_check=False):  # the record says the report whole; a signal now ends the command
                journal.end(report)
        except BaseException as exc:
            # how the launch ended when it did not end with a report: a user error, a signal (the SSH preflight,
            # before the job's own trap takes the signals), a bug; a second signal waits for the record
            if journal is not None:
                with interrupts.held(then_check=False):
                    journal.end(exit_code=_end_code(exc), error=_end_error(exc))
            raise
    return report


def _end_code(exc: BaseException) -> int:
    if isinstance(exc, DistlaunchError | Interrupted):
        return int(exc.exit_code)
    return int(ExitCode.SIGINT if isinstance(exc, KeyboardInterrupt) else ExitCode.CHECK_FAILED)


def _end_error(exc: BaseException) -> str:
    if isinstance(exc, Interrupted):
        return f"interrupted by {exc.name}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return str(exc) if isinstance(exc, DistlaunchError) else f"internal error: {type(exc).__name__}: {exc}"


def _launch(ctx: LaunchContext) -> RunReport:
    plan, opts = ctx.plan, ctx.opts
    if plan.spares is not None:
        return _heal(ctx)
    hosts = open_hosts(plan, opts)
    with hosts if hosts is not None else nullcontext():
        ctx.adopt(decided_plan(plan, opts, ctx.exec_opts, hosts))
        if hosts is None:
            return ctx.execute(with_network(ctx.plan, None, ctx.sink.notice), make_connect(opts))
        try:
            return ctx.execute(with_network(ctx.plan, hosts, ctx.sink.notice), make_connect(opts, hosts))
        except CannotStart as exc:
            raise cannot_start_error(exc.problems, opts, ctx.plan) from None


def open_hosts(plan: LaunchPlan, opts: LaunchOptions, timeout: float | None = None) -> RemoteHosts | None:
    """Preflight: every remote host of the plan connected and able to run the agent before any rank starts
    anywhere (HostsFailed, exit 3, naming each host that is not); None when every host is this machine. A failed
    preflight forgets what its hosts reported before (jobs/inventories.py): they may not be what they were."""
    remote = [node.host for node in plan.nodes if not node.local]
    if not remote:
        return None
    from distlaunch.remote.preflight import preflight  # paramiko: only paid when a host is remote

    try:
        return preflight(
            remote,
            ssh_config=opts.ssh_config,
            accept_new_host_keys=opts.accept_new_host_keys,
            python=next(node.agent_python for node in plan.nodes if not node.local),  # one for every remote host
            workdir=plan.nodes[0].workdir,
            job_id=plan.job_id,
            timeout=timeout,
        )
    except BaseException:
        if opts.hostfile is not None:
            forget(cache_key(opts.hostfile, opts.ssh_config))
        raise


def hosts_decide(plan: LaunchPlan, opts: LaunchOptions, hosts: RemoteHosts | None) -> Decisions:
    """What the plan's hosts decide, from the inventories the preflight read (this machine's own for its hosts);
    what the remote ones reported is kept for the next plan of the hostfile. Hosts that disagree are refused
    (UsageError, exit 2)."""
    local = local_inventory() if any(node.local for node in plan.nodes) else None
    found = {n.host: local if n.local else (hosts.inventories.get(n.host) if hosts else None) for n in plan.nodes}
    remote = {host: inv for host, inv in found.items() if inv is not None and inv is not local}
    if remote and opts.hostfile is not None:
        remember(cache_key(opts.hostfile, opts.ssh_config), remote)
    source = "the hosts" if remote else "this machine"
    return decide(found, opts.backend, nproc_rule(opts), source)


def decided_plan(
    plan: LaunchPlan, opts: LaunchOptions, exec_opts: ExecOptions, hosts: RemoteHosts | None
) -> LaunchPlan:
    """The plan as the hosts decide it (``hosts_decide``), made once here, before any rank starts: the same plan
    where it was decided already (with the facts as read now), else rebuilt with its job id and port."""
    decisions = hosts_decide(plan, opts, hosts)
    before = plan.decisions
    facts = {"source", "inventories"}  # what the decisions came from; a host's free memory changes by the second
    if before is not None and before.model_dump(exclude=facts) == decisions.model_dump(exclude=facts):
        return plan.model_copy(update={"decisions": decisions})
    spec = spec_for(opts, exec_opts.workdir, exec_opts.flight_recorder, decisions)
    return build_plan(spec.model_copy(update={"job_id": plan.job_id, "master_port": plan.master_port}))


def probed_plan(plan: LaunchPlan, opts: LaunchOptions, exec_opts: ExecOptions) -> LaunchPlan:
    """``--dry-run --probe``: the launch's own preflight (every host contacted, its inventory read) and its
    decisions; no rank starts, the agents it started end."""
    hosts = open_hosts(plan, opts)
    with hosts if hosts is not None else nullcontext():
        return decided_plan(plan, opts, exec_opts, hosts)


Build = Callable[[list[HostSlots], LayoutSpec, Decisions | None], LaunchPlan]  # a plan of these hosts


def decided_attempt(attempt: LaunchPlan, decisions: Decisions, slots: dict[str, HostSlots], build: Build) -> LaunchPlan:
    """The first attempt of a job with spares as its hosts decided it: the same hosts, ranks and layout on the
    backend they chose; where they count the ranks (-n auto|gpu), each host's slots, and dp filling them."""
    if decisions.ranks:
        hosts = [slots[node.host] for node in attempt.nodes]
        layout = LayoutSpec(**{**attempt.parallel.model_dump(), "dp": None})
    else:
        hosts = [slots[n.host].model_copy(update={"slots": slots[n.host].slots[: len(n.ranks)]}) for n in attempt.nodes]
        layout = attempt.parallel
    return build(hosts, layout, decisions)


def _heal(ctx: LaunchContext) -> RunReport:
    """A job with spares: every attempt's hosts checked before it starts; a failed host replaced or the job shrunk
    (launcher/elastic/healing.py). The hosts decide once, at the first attempt whose hosts all pass the preflight
    (a host that fails it is replaced as at any attempt); every later attempt keeps that."""
    from distlaunch.launcher.planning.train import engine_layout_problem

    plan, opts = ctx.plan, ctx.opts
    spares = plan.spares.hosts if plan.spares is not None else []
    slots = {h.host: h for h in resolve_hosts(opts)}  # the plan keeps ranks, not slots: the hostfile has them
    active = [slots[node.host] for node in plan.nodes]
    addresses = host_addresses(opts, [*active, *spares])
    workdir = plan.nodes[0].workdir

    def build(hosts: list[HostSlots], layout: LayoutSpec, decisions: Decisions | None) -> LaunchPlan:
        layout_opts = opts.model_copy(update={"parallel": str(layout)})
        spec = make_spec(layout_opts, hosts, addresses, workdir, ctx.exec_opts.flight_recorder, decisions)
        return build_plan(spec.model_copy(update={"job_id": plan.job_id, "spares": plan.spares}))

    def connect(attempt_plan: LaunchPlan):
        if attempt_plan.master_addr != plan.master_addr and starts_rank0_here(attempt_plan):
            check_master_port(opts, attempt_plan.master_port)  # a new master: launch() checked the first one
        hosts = open_hosts(attempt_plan, opts, PREFLIGHT_TIMEOUT_S)
        try:
            if ctx.plan.decisions is None:
                decisions = hosts_decide(attempt_plan, opts, hosts)
                attempt_plan = decided_attempt(attempt_plan, decisions, slots, build)
                ctx.adopt(attempt_plan)
            # every attempt's hosts choose their cards, as a job without spares does: a spare has its own
            return with_network(attempt_plan, hosts, ctx.sink.notice), make_connect(opts, hosts), hosts
        except BaseException:
            if hosts is not None:
                hosts.close()
            raise

    def replan(hosts: list[HostSlots], layout: LayoutSpec) -> LaunchPlan:
        return build(hosts, layout, ctx.plan.decisions)

    pool = Pool(active=active, spares=list(spares), nodes=opts.nodes)
    max_restarts = ctx.exec_opts.max_restarts
    healing = Healing(plan, pool, replan, connect, max_restarts, ctx.sink.notice, engine_layout_problem(opts))
    first = healing.start()
    try:
        return ctx.execute(first.plan, first.connect, healing)
    except CannotStart as exc:
        raise cannot_start_error(exc.problems, opts, ctx.plan) from None
    finally:
        healing.close()


def cannot_start_error(problems: dict[str, list[dict]], opts: LaunchOptions, plan: LaunchPlan) -> UsageError:
    """What the agents found before any rank started, in one line: the first problem, with every host that
    has the same one (a script not copied to three hosts is one fact, not three)."""
    problems = {n.host: problems[n.host] for n in plan.nodes if n.host in problems}  # the hostfile's order
    first = next(iter(problems.values()))[0]
    hosts = [host for host, found in problems.items() if first in found]
    error = start_error(first, program_label(opts), plan.nodes[0].workdir, f" on {', '.join(hosts)}")
    others = [host for host in problems if host not in hosts]
    if others:
        error.message += f"; {', '.join(others)} cannot start their ranks either (fix this, then run again)"
    return error
