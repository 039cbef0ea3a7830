"""Checks of how a host reaches the master: name resolution, the TCP connection to MASTER_ADDR:MASTER_PORT,
and the interface gloo and NCCL should use. Pure functions from gathered facts to findings."""

from __future__ import annotations

from distlaunch.contract.hostname import host_port
from distlaunch.contract.inventory import Interface
from distlaunch.doctor.checks_host import is_loopback
from distlaunch.doctor.gather import ListenerResult
from distlaunch.doctor.model import Check, HostFacts, check


def dns_check(host: str, target_name: str | None, facts: HostFacts | None, master_addr: str) -> Check:
    """The host resolved here (it was reached) and MASTER_ADDR resolves on the host."""
    here = f"{target_name} resolves here" if target_name else "this machine"
    master = (facts.master or {}) if facts else {}
    if facts is None or not master:
        return check("dns", host, "pass", f"{here}; MASTER_ADDR not checked on the host (no probe)")
    if master.get("resolved") is None:
        return check(
            "dns",
            host,
            "fail",
            f"MASTER_ADDR {master_addr!r} does not resolve on {host}: {master.get('error')}",
            f"use the master's IP address as --master-addr, or add '{master_addr}' to DNS or /etc/hosts on {host}",
        )
    return check("dns", host, "pass", f"{here}; MASTER_ADDR {master_addr} → {', '.join(master['resolved'])} on {host}")


def reachable_check(host: str, facts: HostFacts | None, listener: ListenerResult) -> Check:
    """The host opened a TCP connection to the doctor's listener at MASTER_ADDR:MASTER_PORT."""
    where = host_port(listener.address, listener.port)
    if not listener.bound:
        return check("master-reachable", host, "skip", f"no listener on {where} (see master-port)")
    master = (facts.master or {}) if facts else {}
    if facts is None or master.get("resolved") is None:
        return check("master-reachable", host, "skip", "not probed (see python / dns)")
    connect = master.get("connect") or {}
    result = connect.get("result")
    ms = f"{connect.get('seconds', 0) * 1000:.0f} ms"
    if result == "ok" and connect.get("token") == listener.nonce:
        return check("master-reachable", host, "pass", f"connected to {where} in {ms}")
    if result == "ok":
        return check(
            "master-reachable",
            host,
            "fail",
            f"{where} answered {host}, but not the doctor's listener on "
            f"{listener.host}: MASTER_ADDR means another machine or service here",
            f"MASTER_ADDR must be an address of {listener.host} that {host} reaches; check /etc/hosts and DNS on {host}",
        )
    if result == "refused":
        return check(
            "master-reachable",
            host,
            "fail",
            f"connection to {where} refused (after {ms}): nothing listens there as "
            f"seen from {host}, or a firewall rejects the port",
            f"check that MASTER_ADDR is {listener.host}'s address on the network {host} uses; "
            f"allow TCP {listener.port} (and 29500-29599) in firewalls: iptables -L -n, security groups",
        )
    if result == "timeout":
        return check(
            "master-reachable",
            host,
            "fail",
            f"no answer from {where} within {connect.get('seconds', 0):.1f}s: a firewall drops the packets",
            f"allow TCP port {listener.port} from {host} to {listener.host} "
            f"(e.g. iptables -I INPUT -p tcp --dport {listener.port} -j ACCEPT; cloud security groups), and "
            "all TCP between hosts: gloo and NCCL open random ports after the rendezvous",
        )
    return check(
        "master-reachable",
        host,
        "fail",
        f"cannot connect to {where}: {connect.get('error', result)}",
        f"check routing from {host} to {listener.address} (ip route get {listener.address})",
    )


def master_unresolved(host: str, facts: HostFacts) -> str | None:
    """Why the master's address cannot be judged from this host (MASTER_ADDR does not resolve there), or None.
    Checks whose verdict depends on where the master is skip then, instead of failing a second time."""
    master = facts.master or {}
    if master and master.get("resolved") is None:
        return f"MASTER_ADDR does not resolve on {host} (see dns)"
    return None


def nccl_selects(value: str, name: str) -> bool:
    """Does NCCL_SOCKET_IFNAME ``value`` select interface ``name``? (prefixes; ``^`` excludes; ``=`` exact)."""
    exclude = value.startswith("^")
    value = value.lstrip("^")
    exact = value.startswith("=")
    items = [v for v in value.lstrip("=").split(",") if v]
    hit = any(name == v if exact else name.startswith(v) for v in items)
    return not hit if exclude else hit


def route_interface(facts: HostFacts) -> tuple[str | None, str | None]:
    """The interface (and source address) the host uses to reach the master; the master itself uses the
    interface that owns MASTER_ADDR, not the ``lo`` its own-address route reports."""
    master = facts.master or {}
    route = master.get("route") or {}
    dev, src = route.get("dev"), route.get("src")
    address = master.get("address")
    if dev == "lo" and address and not is_loopback(address):
        owner = next((i for i in facts.interfaces if address in i.addrs), None)
        dev, src = (owner.name, address) if owner else (dev, src)
    return dev, src


def _names(ifaces: list[Interface]) -> str:
    return ", ".join(i.name for i in ifaces) or "none"


def ifname_suggestion(devs: list[str | None]) -> str:
    """One NCCL_SOCKET_IFNAME value that selects the interface toward the master on every host: the distinct
    names as a prefix list (``--env`` is global, so a single host's name would break the others)."""
    names = list(dict.fromkeys(d for d in devs if d and d != "lo"))
    return ",".join(names) if names else "^lo,docker"


def _ifname_problems(host: str, var: str, value: str, ifaces: list[Interface]) -> str | None:
    names = {i.name for i in ifaces}
    if var == "NCCL_SOCKET_IFNAME":
        if any(nccl_selects(value, i.name) for i in ifaces):
            return None
        return f"{var}={value} matches no interface that is up on {host} (it has {_names(ifaces)})"
    missing = [n for n in value.split(",") if n and n not in names]
    if not missing:
        return None
    return f"{var}={value}: {', '.join(missing)} is not an interface that is up on {host} (it has {_names(ifaces)})"


def nic_check(
    host: str,
    facts: HostFacts,
    env: dict[str, str],
    single_machine: bool,
    backend: str = "gloo",
    suggest: str | None = None,
) -> Check:
    """The interface toward the master, and whether a user-set NCCL/GLOO_SOCKET_IFNAME selects one on the host.
    Each variable is judged by the backend the job uses: the other backend's variable only warns. Every
    problem is reported, not just the first."""
    dev, src = route_interface(facts)
    ifaces = [i for i in facts.interfaces if i.up]
    nccl, gloo = env.get("NCCL_SOCKET_IFNAME"), env.get("GLOO_SOCKET_IFNAME")
    suggest = suggest or dev or "the interface toward the master"
    fails, warns = [], []
    for var, value, used_by in (("NCCL_SOCKET_IFNAME", nccl, "nccl"), ("GLOO_SOCKET_IFNAME", gloo, "gloo")):
        problem = value and _ifname_problems(host, var, value, ifaces)
        if not problem:
            continue
        if used_by == backend:
            fails.append(f"{problem}: {backend} fails to start ('no socket interface found')")
        else:
            warns.append(f"{problem}: harmless for this {backend} job, fatal for a {used_by} one")
    flagged = any("NCCL" in p for p in fails + warns)
    if nccl and dev and not single_machine and not flagged and not nccl_selects(nccl, dev):
        msg = f"NCCL_SOCKET_IFNAME={nccl} leaves {dev} (toward the master) out: NCCL talks on another network"
        warns.append(msg + (" and hangs if the hosts do not all share it" if backend == "nccl" else ""))
    hint = (
        f"one value for every host (--env applies to all): NCCL_SOCKET_IFNAME={suggest}; "
        "GLOO_SOCKET_IFNAME takes exact names that must exist on every host: "
        + (f"GLOO_SOCKET_IFNAME={suggest}" if "," not in suggest and not suggest.startswith("^") else "leave it unset")
    )
    if fails:
        return check("nic", host, "fail", "; ".join(fails + warns), hint)
    if warns:
        return check("nic", host, "warn", "; ".join(warns), hint)
    if dev is None and (why := master_unresolved(host, facts)):
        return check("nic", host, "skip", f"no route to judge: {why}")
    if dev is None:
        return check(
            "nic",
            host,
            "warn",
            f"no route to the master found on {host} (interfaces: {_names(ifaces)})",
            f"check 'ip route get MASTER_ADDR' on {host}",
        )
    toward = "all ranks on this machine (loopback)" if single_machine else f"route to the master via {dev} (src {src})"
    user = ", ".join(f"{k}={v}" for k, v in (("NCCL_SOCKET_IFNAME", nccl), ("GLOO_SOCKET_IFNAME", gloo)) if v)
    advice = f"set by you: {user}" if user else f"suggested: NCCL_SOCKET_IFNAME={suggest}"
    return check("nic", host, "pass", f"{toward}; {advice}; up: {_names(ifaces)}")


def loopback_hostname_check(
    host: str,
    facts: HostFacts,
    single_machine: bool,
    ifnames_set: bool,
    backend: str = "gloo",
    gloo_set: bool = False,
    named: str | None = None,
) -> Check:
    """The host's own name resolves to 127.x (Ubuntu's '127.0.1.1 NAME' line). Gloo without GLOO_SOCKET_IFNAME
    binds and advertises the address of the hostname, so ranks on other hosts cannot reach it: a gloo job
    fails. Where the launch names the host's card itself (``named``: planning/netcards.py's rule), or NCCL picks
    a non-loopback interface itself (the rendezvous uses MASTER_ADDR), this job runs: only a warning."""
    bad = {}
    for name, addrs in ((facts.hostname, facts.hostname_addrs), (facts.fqdn, facts.fqdn_addrs)):
        if isinstance(addrs, list) and any(is_loopback(a) for a in addrs):
            bad[name] = [a for a in addrs if is_loopback(a)]
    if not bad:
        return check("loopback-hostname", host, "pass", f"{facts.hostname} resolves to {_addrs(facts.hostname_addrs)}")
    seen = ", ".join(f"{name} → {', '.join(addrs)}" for name, addrs in bad.items())
    if single_machine:
        return check("loopback-hostname", host, "pass", f"{seen}: harmless, every rank runs on this machine")
    if why := master_unresolved(host, facts):  # whether the job spans machines is not known yet
        return check("loopback-hostname", host, "skip", f"{seen}: judged once the master is known; {why}")
    dev, addr = route_interface(facts)
    dev = dev or "eth0"
    fix = (
        f"on {host}, map {facts.hostname} to {addr or 'its network address'} in /etc/hosts instead of "
        f"{next(iter(bad.values()))[0]} (like Ubuntu's '127.0.1.1 {facts.hostname}' line), or pass "
        f"--env GLOO_SOCKET_IFNAME={dev} --env NCCL_SOCKET_IFNAME={dev}"
    )
    if backend == "gloo" and not (gloo_set or ifnames_set or named):
        return check(
            "loopback-hostname",
            host,
            "fail",
            f"{seen}: gloo binds and advertises that loopback address, so ranks on other hosts cannot connect "
            "(Gloo connectFullMesh failed ... Connection refused)",
            fix,
        )
    return check(
        "loopback-hostname",
        host,
        "warn",
        f"{seen}; {_why_it_runs(host, dev, backend, gloo_set or ifnames_set, named)}",
        fix,
    )


def _why_it_runs(host: str, dev: str, backend: str, users: bool, named: str | None) -> str:
    """Why a job runs on a host whose name resolves to loopback: the user's GLOO_SOCKET_IFNAME, the card the
    launch names, or NCCL's own pick."""
    if backend == "gloo" and users:
        return "GLOO_SOCKET_IFNAME is set, so gloo uses that interface"
    if backend == "gloo":
        return (
            f"distlaunch sets GLOO_SOCKET_IFNAME={named} on {host} (its card toward the master), so this gloo job "
            "runs; gloo started without it (another launcher) would fail"
        )
    return (
        f"NCCL picks a non-loopback interface itself (toward the master: {dev}), so this {backend} job runs; "
        "a gloo group (or job) on these hosts would fail"
        + (f" without the GLOO_SOCKET_IFNAME={named} distlaunch sets" if named else "")
    )


def _addrs(addrs) -> str:
    return ", ".join(addrs) if isinstance(addrs, list) else f"nothing ({addrs.get('error')})"
