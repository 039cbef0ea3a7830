"""From command-line options to a ``LaunchSpec``: read the hostfile, apply filters, pick the port and
the backend, draw a job id. Everything impure happens here so that ``build_plan`` can stay pure."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import socket
import sys
from pathlib import Path

from distlaunch.agent.rankenv import SCRATCH_MARK, flight_recorder_vars
from distlaunch.contract.endpoint import choose_port
from distlaunch.contract.env import launcher_defaults, parse_env
from distlaunch.contract.hostname import host_key
from distlaunch.contract.layout import layout_spec
from distlaunch.contract.options import LaunchOptions, Nproc
from distlaunch.errors import UsageError
from distlaunch.jobs.inventories import cache_key, remembered
from distlaunch.launcher.planning.decisions import Decisions, decide, local_inventory
from distlaunch.launcher.planning.hostfile import (
    HostSlots,
    apply_filters,
    check_rank_count,
    parse_hostfile_text,
    read_hostfile,
)
from distlaunch.launcher.planning.plan import LaunchSpec
from distlaunch.launcher.planning.program import build_command, preload_modules
from distlaunch.readable import plural
from distlaunch.remote.env import file_env, forwarded_env

log = logging.getLogger("distlaunch")

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_local_host(name: str) -> bool:
    """True for names that mean this machine (no SSH needed). Compared as the hostfile compares hosts
    (``host_key``): names ignore case, as DNS does (``LOCALHOST``, this machine's name in any case), and an
    address in any spelling (``0:0::1``) is that address."""
    key = host_key(name)
    return key in LOCAL_NAMES or key in (host_key(socket.gethostname()), host_key(socket.getfqdn()))


def new_job_id() -> str:
    """A job id unique per launch; it marks every process of the job."""
    return f"dl-{secrets.token_hex(6)}"


def parse_nproc(text: str | int | None) -> Nproc:
    """``-n N``, or torchrun's ``auto`` (each host's GPUs, else 1) and ``gpu`` (each host's GPUs, at least one),
    kept as words: the hosts count their GPUs (``decisions.decide_ranks``), not the machine that parses this."""
    if text is None or isinstance(text, int):
        return text
    if text.strip() in ("auto", "gpu"):
        return text.strip()  # type: ignore[return-value]
    if not re.fullmatch(r"[0-9]+", text.strip()):  # int() would also take "1_0" and other scripts' digits
        what = "is not a whole number" if re.fullmatch(r"[0-9]*\.[0-9]+", text.strip()) else "is not a number"
        raise UsageError(f"--nproc-per-node {text!r} {what}", "give the processes per host, e.g. -n 4, or auto / gpu")
    return int(text)


def parse_backend(text: str) -> str:
    """``--backend``: auto, nccl or gloo."""
    if text not in ("auto", "nccl", "gloo"):
        raise UsageError(
            f"--backend {text!r} is not one of auto, nccl, gloo",
            "distlaunch runs gloo or nccl jobs; write --backend gloo",
        )
    return text


def parse_seconds(text: str | float) -> float:
    """``--grace-period``: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(
            f"--grace-period {text!r} is not a number of seconds", "give seconds from 0 to 86400, e.g. 10"
        ) from None
    if not 0 <= value <= 86400:  # nan too
        raise UsageError(f"--grace-period {text} is out of range", "give seconds from 0 to 86400, e.g. 10")
    return value


# A size as people write one: decimal (40GB) and binary (80GiB) units, any case, or plain bytes.
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"k": 2**10, "m": 2**20, "g": 2**30, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def size_in_bytes(text: str) -> int | None:
    """``80GiB``, ``40GB``, ``64M``, ``81920MiB`` or plain bytes as a whole number of bytes; None for no size."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        return None
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


LOG_SIZE_FLOOR = 64 << 10  # a rank's line may be 16 KiB: a smaller part would hold a handful of lines


def parse_log_size(text: str | int) -> int:
    """``--log-max-size``: the size a rank log reaches before it is rotated (0: never rotated)."""
    value = text if isinstance(text, int) else size_in_bytes(text)
    if value is None:
        raise UsageError(f"--log-max-size {text!r} is not a size", "write e.g. 64MiB, 1GiB or 0 (no limit)")
    if 0 < value < LOG_SIZE_FLOOR:
        raise UsageError(
            f"--log-max-size {text} is below {LOG_SIZE_FLOOR >> 10}KiB: a part would hold only a few lines",
            "give at least 64KiB, or 0 for no limit",
        )
    return value


def inline_hosts(path: Path) -> list[HostSlots] | None:
    """Horovod's ``-H node1:2,node2:2``: a host list written in place of a hostfile that does not exist."""
    text = str(path)
    try:
        exists = path.exists()
    except OSError:  # a name too long for a path (ENAMETOOLONG): no such file, so it may well be host names
        exists = False
    if exists or not re.fullmatch(r"[\w.\-\[\]:]+(,[\w.\-\[\]:]+)*", text) or ("," not in text and ":" not in text):
        return None
    return parse_hostfile_text("\n".join(text.split(",")), f"-H {text}")


def resolve_hosts(opts: LaunchOptions) -> list[HostSlots]:
    """Hosts and their slot lists after the hostfile, --nproc-per-node and --include/--exclude. Under -n auto|gpu
    (and with neither -n nor a hostfile) a host's slots are counted from its GPUs later (``with_ranks``)."""
    n = opts.nproc_per_node if isinstance(opts.nproc_per_node, int) else None
    if n is not None and n < 1:
        raise UsageError(f"--nproc-per-node {n} must be at least 1", "give the number of processes per host, e.g. -n 4")
    if n is not None:
        check_rank_count(n, f"--nproc-per-node {n}")
    if opts.hostfile is None:
        if opts.include is not None or opts.exclude is not None:  # an empty one too: it is not ignored
            raise UsageError("--include/--exclude need a hostfile", "pass -H HOSTFILE")
        return [HostSlots(host="localhost", slots=list(range(n or 1)), explicit=n is not None)]
    hosts = inline_hosts(opts.hostfile) or read_hostfile(opts.hostfile)
    if n is not None:
        for h in hosts:
            if h.explicit and n > h.nslots:
                raise UsageError(
                    f"--nproc-per-node {n} is more than the {plural(h.nslots, 'slot')} of {h.host} in {opts.hostfile}",
                    f"use -n {h.nslots} or less, or raise slots of {h.host}",
                )
        check_rank_count(n * len(hosts), f"the world size ({len(hosts)} hosts × -n {n})")
        hosts = [h.model_copy(update={"slots": h.slots[:n] if h.explicit else list(range(n))}) for h in hosts]
    return apply_filters(hosts, opts.include, opts.exclude)


def nproc_rule(opts: LaunchOptions) -> Nproc:
    """-n as the hosts apply it: without a hostfile and without -n, this machine runs one rank per GPU, or one."""
    return opts.nproc_per_node if opts.hostfile is not None else (opts.nproc_per_node or "auto")


def with_ranks(hosts: list[HostSlots], decisions: Decisions | None, opts: LaunchOptions) -> list[HostSlots]:
    """Each host's slots as its GPUs count them (``Decisions.ranks``): the first ones of a ``slots=`` line."""
    if decisions is None or not decisions.ranks:
        return hosts
    counted = []
    for h in hosts:
        n = decisions.ranks.get(h.host, h.nslots)
        if h.explicit and n > h.nslots:
            raise UsageError(
                f"--nproc-per-node {opts.nproc_per_node}: {h.host} has {plural(n, 'GPU')}, more than its "
                f"{plural(h.nslots, 'slot')} in {opts.hostfile}",
                f"give -n {h.nslots}, or raise slots of {h.host}",
            )
        counted.append(h.model_copy(update={"slots": h.slots[:n] if h.explicit else list(range(n))}))
    check_rank_count(sum(h.nslots for h in counted), "the world size")
    return counted


def ago(seconds: float) -> str:
    """How long ago, as a plan says it: ``just now``, ``3 min ago``."""
    return "just now" if seconds < 60 else f"{int(seconds // 60)} min ago"


def known_decisions(opts: LaunchOptions, hosts: list[HostSlots]) -> Decisions | None:
    """The hosts' decisions as far as they are known without contacting a host: this machine's inventory for the
    hosts that are this machine, what the remote ones reported within the last minutes (jobs/inventories.py).
    None while a remote host's facts are unknown: the launch's preflight reads them."""
    remote = [h.host for h in hosts if not is_local_host(h.host)]
    kept = remembered(cache_key(opts.hostfile, opts.ssh_config)) if remote and opts.hostfile is not None else None
    if remote and (kept is None or not set(remote) <= set(kept.hosts)):
        return None
    local = local_inventory() if len(remote) < len(hosts) else None
    inventories = {h.host: kept.hosts[h.host] if kept and h.host in remote else local for h in hosts}
    source = f"the hosts, as they reported {ago(kept.age())}" if kept else "this machine"
    return decide(inventories, opts.backend, nproc_rule(opts), source)


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8 and ::1 (a master there is on this machine, so a free port can be picked here)."""
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def job_env(opts: LaunchOptions, all_local: bool) -> dict[str, str]:
    """Variables every rank gets on top of the contract: forwarded ones (remote jobs), env files, --env."""
    # Local ranks inherit the launcher's environment anyway; remote ones get only what is named here.
    env = {} if all_local else forwarded_env()
    env.update(file_env(announce=log.info))
    env.update(parse_env(opts.env))
    return env


def check_master_port(opts: LaunchOptions, port: int) -> None:
    """A fixed --master-port that something already listens on here (the master's machine: call it only
    there) is refused before any rank starts: rank 0 could not bind it, and ranks could join another job's
    store."""
    if opts.master_port == "auto":
        return
    from distlaunch.launcher.planning.listener_script import (  # stdlib only
        bind_every_address,
        describe_holders,
        holders,
    )

    hint = (
        "pick a free port, or leave --master-port auto (a free one is chosen); two jobs on one port would cross-connect"
    )
    held = holders(port)
    if held:
        who, _ = describe_holders(held)
        raise UsageError(f"--master-port {port} is already in use on this machine (the master): {who}", hint)
    if bind_every_address(port)[0] == "in-use":
        raise UsageError(
            f"--master-port {port} is already in use on this machine (the master): an open connection uses it as its local port",
            hint,
        )


def address_toward(host: str) -> str | None:
    """This machine's address on its route to ``host``: where ``host`` reaches us (a UDP connect sends
    nothing). None when ``host`` does not resolve or has no route."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(addr)
                return str(probe.getsockname()[0])
            except OSError:
                continue
    return None


def address_for_peer(peer: str) -> str:
    """This machine's address as ``peer`` reaches it: the address on the route to ``peer``, else (no route
    known, as in a dry run) its fully qualified name. Never the name alone when a route is known: Debian and
    Ubuntu map this machine's name to 127.0.1.1 in /etc/hosts, which no other host reaches."""
    return address_toward(peer) or socket.getfqdn()


def master_for(hosts: list[HostSlots], local_hosts: list[str], addresses: dict[str, str]) -> str:
    """MASTER_ADDR when --master-addr is not given: the first host as the others reach it. When that host
    is this machine (maybe under a name only it knows, as ``localhost``) and others are remote: its address
    on the route to them, else (no route known yet, as in a dry run) its fully qualified name."""
    first = hosts[0].host
    remote = [h.host for h in hosts if h.host not in local_hosts]
    if first not in local_hosts or not remote:
        return addresses.get(first, first)
    return address_for_peer(addresses.get(remote[0], remote[0]))


def make_spec(
    opts: LaunchOptions,
    hosts: list[HostSlots] | None = None,
    addresses: dict[str, str] | None = None,
    workdir: str | None = None,
    flight_recorder: bool = False,
    decisions: Decisions | None = None,
) -> LaunchSpec:
    """Resolve options into a LaunchSpec; ``hosts`` as ``resolve_hosts`` gave them (read here when None),
    ``addresses`` maps remote host aliases to what other hosts can reach. Which hosts are this machine is
    decided here, once, and kept in the spec and the plan. ``flight_recorder``: the job has a hang watch, whose
    ranks get NCCL's flight recorder (``ExecOptions.flight_recorder``). ``decisions``: what the hosts decided (a
    launch's preflight read them); else what is known of them without contacting one (``known_decisions``)."""
    hosts = hosts if hosts is not None else resolve_hosts(opts)
    decisions = decisions or known_decisions(opts, hosts)
    hosts = with_ranks(hosts, decisions, opts)
    # absolute: a remote host would take a relative --workdir from its login folder, not from ours
    workdir = os.path.abspath(os.path.expanduser(workdir)) if workdir else os.getcwd()
    local_hosts = [h.host for h in hosts if is_local_host(h.host)]
    all_local = len(local_hosts) == len(hosts)
    addresses = {h.host: "127.0.0.1" for h in hosts} if all_local else dict(addresses or {})
    first = hosts[0].host
    master_addr = opts.master_addr or master_for(hosts, local_hosts, addresses)
    backend = opts.backend if decisions is None else decisions.backend  # auto: the hosts decide at start
    env = job_env(opts, all_local)
    env.update(launcher_defaults(backend, max(h.nslots for h in hosts), {**os.environ, **env}))
    if flight_recorder:  # as every agent sets it, unless the user's environment does (a rank here inherits this one)
        env.update(flight_recorder_vars(SCRATCH_MARK, {**os.environ, **env}))
    return LaunchSpec(
        hosts=hosts,
        command=build_command(opts, workdir),
        parallel=layout_spec(opts.parallel),
        master_addr=master_addr,
        master_port=choose_port(opts.master_port, first in local_hosts or is_loopback(master_addr)),
        backend=backend,
        env=env,
        job_id=new_job_id(),
        addresses=addresses,
        local_hosts=local_hosts,
        workdir=workdir,
        agent_python=opts.remote_python or sys.executable,  # --python picks the ranks' interpreter only
        local_python=sys.executable,
        max_restarts=opts.max_restarts,
        decisions=decisions,
        cpu_bind=opts.cpu_bind,
        preload=preload_modules(opts),
    )
