"""``run_doctor``: read the hosts, gather facts from all of them in parallel, and turn the facts into
checks: the one library call behind ``distlaunch doctor``."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

from distlaunch import interrupts
from distlaunch.contract.endpoint import auto_port_text
from distlaunch.contract.env import parse_env
from distlaunch.contract.options import LaunchOptions
from distlaunch.doctor.bench import bench_check, run_bench
from distlaunch.doctor.checks_cluster import (
    clock_checks,
    duplicate_checks,
    hostfile_check,
    hostfile_error,
    master_port_check,
    parallel_check,
    parallel_spec_error,
    ssh_checks,
)
from distlaunch.doctor.checks_host import (
    gpus_check,
    is_loopback,
    memlock_check,
    nccl_check,
    python_check,
    shm_check,
    torch_check,
    workdir_check,
)
from distlaunch.doctor.checks_network import (
    dns_check,
    ifname_suggestion,
    loopback_hostname_check,
    nic_check,
    reachable_check,
    route_interface,
)
from distlaunch.doctor.gather import Gathering, HostResult, ListenerResult, is_loopback_name
from distlaunch.doctor.model import CHECK_IDS, LOCAL, Check, DoctorOptions, DoctorReport, HostFacts, check
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.decisions import decide_backend
from distlaunch.launcher.planning.netcards import launch_card, master_ip
from distlaunch.launcher.planning.spec import is_local_host, resolve_hosts
from distlaunch.launcher.running.launch import spec_for
from distlaunch.remote.sshconfig import resolve_targets

PROBED = (
    "python",
    "workdir",
    "torch-version",
    "nccl",
    "gpus",
    "loopback-hostname",
    "master-reachable",
    "nic",
    "shm",
    "memlock",
)


def _local_version() -> str | None:
    try:
        return version("distlaunch")
    except PackageNotFoundError:
        return None


def load_hosts(opts: DoctorOptions) -> list[HostResult]:
    """The hostfile's hosts (after -n/--include/--exclude) with their SSH targets; local names need none."""
    launch = LaunchOptions(
        program=[],
        hostfile=opts.hostfile,
        nproc_per_node=opts.nproc_per_node,
        include=opts.include,
        exclude=opts.exclude,
    )
    hosts = resolve_hosts(launch)
    remote = [h.host for h in hosts if not is_local_host(h.host)]
    targets = resolve_targets(remote, opts.ssh_config) if remote else {}
    return [HostResult(host=h.host, slots=h, target=targets.get(h.host)) for h in hosts]


def launch_endpoint(opts: DoctorOptions) -> tuple[str, int, str, str]:
    """MASTER_ADDR, MASTER_PORT and the backend exactly as ``distlaunch run`` resolves them for the same
    options (the launcher's own functions), and, for ``--master-port auto``, how run chooses at launch."""
    launch = LaunchOptions(
        program=["distlaunch.doctor"],
        module=True,
        hostfile=opts.hostfile,
        nproc_per_node=opts.nproc_per_node,
        include=opts.include,
        exclude=opts.exclude,
        master_addr=opts.master_addr,
        master_port=opts.master_port,
        backend=opts.backend,
        ssh_config=opts.ssh_config,
    )
    spec = spec_for(launch)
    note = ""
    if opts.master_port == "auto":
        local = spec.hosts[0].host in spec.local_hosts or is_loopback(spec.master_addr)
        note = f"--master-port auto: run picks {auto_port_text(local)}; probed {spec.master_port}"
    return spec.master_addr, spec.master_port, spec.backend, note


def user_env(opts: DoctorOptions) -> dict[str, str]:
    """The environment ranks would see: the launcher's own, overridden by --env."""
    return {**os.environ, **parse_env(opts.env)}


def host_checks(r: HostResult, ctx: dict) -> list[Check]:
    """Every per-host check that reads the probe's facts (skips when there are none)."""
    f, host = r.facts, r.host
    if f is None:
        why = r.ssh_error.check_id if r.ssh_error else None
        if why is None and r.shell_hung:
            return [
                check("python", host, "fail", r.probe_error, r.hint),
                *[check(id, host, "skip", "not probed (see python)") for id in PROBED[1:]],
            ]
        if why is None and r.probe_hung:
            return [
                check(
                    "python",
                    host,
                    "fail",
                    f"{r.probe_error} on {host}",
                    f"run 'ssh {host} {ctx['python']} -c pass': something at its startup blocks (sitecustomize, "
                    "a .pth file, a wrapper script, a hung network file system); or pass "
                    "--remote-python with another one",
                ),
                *[check(id, host, "skip", "not probed (see python)") for id in PROBED[1:]],
            ]
        if why is None and "shell startup file" in (r.probe_error or ""):
            return [
                check(
                    "python",
                    host,
                    "fail",
                    f"{ctx['python']} ran on {host}, but {r.probe_error}",
                    f"make the shell startup files on {host} print nothing for non-interactive logins "
                    "(put output after the '[ -z \"$PS1\" ] && return' guard)",
                ),
                *[check(id, host, "skip", "not probed (see python)") for id in PROBED[1:]],
            ]
        if why is None:
            return [
                check(
                    "python",
                    host,
                    "fail",
                    f"{ctx['python']} could not run the probe on {host}: {r.probe_error}",
                    f"install Python 3 on {host}, or pass --remote-python with the interpreter the ranks use",
                ),
                *[check(id, host, "skip", "not probed (see python)") for id in PROBED[1:]],
            ]
        return [check(id, host, "skip", f"host not reached (see {why})") for id in PROBED]
    ref = ctx["reference"]
    return [
        ranks_python_check(host, r, ctx) or python_check(host, f, ref, ctx["version"]),
        workdir_check(host, f),
        *torch_checks(host, r, ctx),
        gpus_check(host, f, r.slots.nslots, r.slots.explicit, ctx["any_gpus"]),
        loopback_hostname_check(
            host,
            f,
            ctx["single_machine"],
            ctx["ifnames_set"],
            ctx["backend"],
            bool(ctx["env"].get("GLOO_SOCKET_IFNAME")),
            launch_card_name(f, ctx["master_ip"]),
        ),
        reachable_check(host, f, ctx["listener"]),
        nic_check(host, f, ctx["env"], ctx["single_machine"], ctx["backend"], ctx["suggest"]),
        shm_check(host, f),
        memlock_check(host, f),
    ]


def torch_checks(host: str, r: HostResult, ctx: dict) -> list[Check]:
    """torch-version and nccl, judged on the interpreter the ranks run: --python's where it is given."""
    if r.ranks is not None and r.ranks.facts is None:
        return [
            check(id, host, "skip", "the ranks' interpreter did not run (see python)")
            for id in ("torch-version", "nccl")
        ]
    facts, flag = (r.ranks.facts, "--python") if r.ranks is not None else (r.facts, "--remote-python")
    ref = ctx["ranks_reference"]
    return [torch_check(host, facts, ref, r is ctx["master"], flag), nccl_check(host, facts, ref)]


def ranks_python_check(host: str, r: HostResult, ctx: dict) -> Check | None:
    """With --python: the ranks' interpreter could not run on the host (None: it did, or none was given)."""
    if r.ranks is None or r.ranks.facts is not None:
        return None
    return check(
        "python",
        host,
        "fail",
        f"the ranks' interpreter {ctx['ranks_python']} could not run on {host}: {r.ranks.probe_error}",
        "give --python an interpreter that every host has (a relative path is from --workdir), or leave it out",
    )


def launch_card_name(facts: HostFacts, master: str | None) -> str | None:
    """The card the launch will name for this host's ranks (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), by its own
    rule (planning/netcards.py), where the user names none; None where it names none."""
    card = launch_card(facts.inventory, master) if master is not None else None
    return card.name if card is not None else None


def hosts_backend(backend: str, results: list[HostResult]) -> str:
    """``--backend auto`` as the hosts' own facts decide it, as a launch's preflight does (one rule:
    ``decide_backend``); still ``auto`` where some host gave no facts or the hosts disagree (their gpus checks
    say so)."""
    if backend != "auto" or any(r.facts is None for r in results):
        return backend
    try:
        return decide_backend(backend, {r.host: r.facts.gpu_count for r in results if r.facts is not None})
    except UsageError:
        return backend


def classify(
    results: list[HostResult], listener: ListenerResult, opts: DoctorOptions, backend: str = "gloo"
) -> list[Check]:
    """All findings, host by host in hostfile order, each host's checks in CHECK_IDS order."""
    env = user_env(opts)
    ctx = {
        "backend": backend,
        "master_ip": master_ip(listener.address),
        "suggest": ifname_suggestion([route_interface(r.facts)[0] for r in results if r.facts is not None]),
        "reference": results[0].facts,
        "ranks_reference": (results[0].ranks and results[0].ranks.facts) or results[0].facts,
        "ranks_python": opts.ranks_python,
        "master": results[0],
        "version": _local_version(),
        "listener": listener,
        "python": opts.remote_python,
        "env": env,
        "ifnames_set": bool(env.get("NCCL_SOCKET_IFNAME") and env.get("GLOO_SOCKET_IFNAME")),
        "any_gpus": any(r.facts and r.facts.gpu_count for r in results),
        # every rank on one machine: a loopback master address, or a hostfile of this machine's names only
        "single_machine": is_loopback(listener.address)
        or is_loopback_name(listener.address)
        or all(r.loopback for r in results),
    }
    checks: list[Check] = [master_port_check(listener)]
    for r in results:
        checks += ssh_checks(r)
        if r.ssh_error is None or r.ssh_error.check_id != "dns":
            target = r.target.hostname if r.target else None
            checks.append(dns_check(r.host, target, r.facts, listener.address))
        checks += host_checks(r, ctx)
    checks += duplicate_checks(results) + clock_checks(results)
    order = {id: i for i, id in enumerate(CHECK_IDS)}
    hosts = {r.host: i for i, r in enumerate(results)}
    return sorted(checks, key=lambda c: (hosts.get(c.host, -1), order.get(c.id, len(order))))


def run_doctor(opts: DoctorOptions) -> DoctorReport:
    """Check the cluster described by ``opts`` and report every finding (never raises for a bad host)."""
    try:
        results = load_hosts(opts)
    except UsageError as exc:
        return DoctorReport.of([hostfile_error(exc)], usage_error=True)
    bad_spec = parallel_spec_error(opts.parallel)
    if bad_spec is not None:  # a spec that does not parse is wrong input (exit 2); one that does not fit fails
        return DoctorReport.of([bad_spec], usage_error=True)
    source = str(opts.hostfile) if opts.hostfile else None
    head = [
        hostfile_check([r.slots for r in results], source),
        parallel_check(opts.parallel, [r.slots for r in results]),
    ]
    try:
        address, port, backend, note = launch_endpoint(opts)
    except UsageError as exc:  # a --master-port that run would refuse
        return DoctorReport.of([*head, check("master-port", LOCAL, "fail", exc.message, exc.hint)], usage_error=True)
    gathering = Gathering(results, opts, address, port)
    gathering.listener.chosen_at_launch = note
    results, listener = gathering.run()
    interrupts.check()  # a signal the gathering's threads or SSH clients swallowed ends the doctor here
    checks = head + classify(results, listener, opts, hosts_backend(backend, results))
    if not opts.bench:
        return DoctorReport.of(checks)
    if any(c.status == "fail" for c in checks):
        return DoctorReport.of([*checks, check("bench", LOCAL, "skip", "not run: fix the failed checks first")])
    outcome = run_bench(results, opts, listener.address)
    if isinstance(outcome, Check):
        return DoctorReport.of([*checks, outcome])
    return DoctorReport.of([*checks, bench_check(outcome)], bench=outcome)
