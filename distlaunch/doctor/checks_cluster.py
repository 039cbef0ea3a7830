"""Checks that look at the inputs (hostfile, parallel spec), at how each host was reached (SSH), and across
hosts (duplicates, clocks, the master's port). Pure functions from gathered facts to findings."""

from __future__ import annotations

from distlaunch.contract.hostname import host_port
from distlaunch.contract.layout import layout_spec
from distlaunch.doctor.gather import CLOCK_ROUND_TRIPS, HostResult, ListenerResult
from distlaunch.doctor.model import LOCAL, Check, check
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.launcher.planning.listener_script import describe_holders
from distlaunch.launcher.planning.plan import host_layout
from distlaunch.readable import plural
from distlaunch.remote import sshlog
from distlaunch.remote.ssh import SshError

CLOCK_SKEW_WARN_S = 1.0
SSH_CHECKS = ("dns", "ssh.connect", "ssh.hostkey", "ssh.auth")  # the order a connection goes through them


def hostfile_check(hosts: list[HostSlots], source: str | None) -> Check:
    """The hostfile parsed (errors come as UsageError, turned into a failed check by the caller)."""
    slots = sum(h.nslots for h in hosts)
    if source is None:
        return check("hostfile", LOCAL, "pass", f"no hostfile: this machine only, {plural(slots, 'slot')}")
    bare = [h.host for h in hosts if not h.explicit]
    note = f"; {', '.join(bare)} without slots=N: 1 slot or -n" if bare else ""
    return check("hostfile", LOCAL, "pass", f"{source}: {plural(len(hosts), 'host')}, {plural(slots, 'slot')}{note}")


def hostfile_error(exc: UsageError) -> Check:
    """A hostfile (or filter) that does not parse: the doctor cannot check any host."""
    return check("hostfile", LOCAL, "fail", exc.message, exc.hint)


def parallel_spec_error(spec_text: str | None) -> Check | None:
    """A --parallel that does not parse (an unknown key, tp=0, zero=9, a key given twice): the input itself is
    wrong, as with a bad hostfile, so no host is checked. None when it parses (whether it fits is
    ``parallel_check``'s question)."""
    try:
        layout_spec(spec_text)
    except UsageError as exc:
        return check("parallel", LOCAL, "fail", exc.message, exc.hint)
    return None


def parallel_check(spec_text: str | None, hosts: list[HostSlots]) -> Check:
    """dp·tp·pp equals the world size, and every tensor-parallel group stays inside one host."""
    world = sum(h.nslots for h in hosts)
    try:
        parallel = host_layout(layout_spec(spec_text), hosts)
    except UsageError as exc:
        return check("parallel", LOCAL, "fail", exc.message, exc.hint)
    given = "" if spec_text else " (default: data parallel only)"
    return check("parallel", LOCAL, "pass", f"{parallel} fits world size {world}{given}")


def ssh_checks(result: HostResult) -> list[Check]:
    """dns / ssh.connect / ssh.hostkey / ssh.auth for one host: the failed step, passes before it, skips after."""
    host, target = result.host, result.target
    if target is None:
        return [check(id, host, "skip", "this machine: no SSH needed") for id in SSH_CHECKS if id != "dns"]
    error: SshError | None = result.ssh_error
    failed = SSH_CHECKS.index(error.check_id) if error else len(SSH_CHECKS)
    passes = {
        "dns": f"{target.hostname} resolves here",
        "ssh.connect": f"sshd answers on {target.endpoint}",
        "ssh.hostkey": "host key matches known_hosts",
        "ssh.auth": f"logged in as {target.user}",
    }
    out = []
    for i, id in enumerate(SSH_CHECKS):
        if i < failed:
            out.append(check(id, host, "pass", passes[id]))
        elif i == failed:
            out.append(check(id, host, "fail", error.detail + ssh_library_said(target.alias), error.hint))
        else:
            out.append(check(id, host, "skip", f"not reached (see {error.check_id})"))
    return out[1:] if error is None or error.check_id != "dns" else out  # dns: reported with MASTER_ADDR later


def ssh_library_said(alias: str) -> str:
    """paramiko's first own words on a failed connection, when they add to ours (kept off stderr)."""
    said = sshlog.messages(alias)
    return f" (SSH library: {said[0]})" if said else ""


def duplicate_checks(results: list[HostResult]) -> list[Check]:
    """Two hostfile entries that are one machine (same machine-id, boot id and hostname)."""
    groups: dict[tuple, list[HostResult]] = {}
    for r in results:
        if r.facts is not None and (r.facts.machine_id or r.facts.boot_id):
            groups.setdefault((r.facts.machine_id, r.facts.boot_id, r.facts.hostname), []).append(r)
    out = []
    for r in results:
        if r.facts is None:
            out.append(check("duplicate-host", r.host, "skip", "not probed"))
            continue
        group = groups.get((r.facts.machine_id, r.facts.boot_id, r.facts.hostname), [r])
        first = group[0]
        if first is r:
            out.append(
                check(
                    "duplicate-host",
                    r.host,
                    "pass",
                    f"machine {r.facts.hostname} (machine-id {(r.facts.machine_id or '?')[:12]})"
                    + (f", also listed as {', '.join(g.host for g in group[1:])}" if len(group) > 1 else ""),
                )
            )
        elif all(g.loopback for g in group):
            out.append(
                check(
                    "duplicate-host",
                    r.host,
                    "pass",
                    f"same machine as {first.host}, reached at a loopback address: a cluster simulated on this machine",
                )
            )
        else:
            out.append(
                check(
                    "duplicate-host",
                    r.host,
                    "fail",
                    f"{r.host} is the same machine as {first.host} ({r.facts.hostname}, "
                    f"machine-id {(r.facts.machine_id or '?')[:12]}, same boot): its ranks would share GPUs and ports",
                    f"list {r.facts.hostname} once in the hostfile, with all its slots (slots=N)",
                )
            )
    return out


def clock_checks(results: list[HostResult]) -> list[Check]:
    """Clock offset of every host from the master's (beyond the measuring error); over 1 s warns."""
    probed = [r for r in results if r.facts is not None]
    if not probed:
        return []
    ref = results[0] if results[0].facts is not None else probed[0]
    out = []
    for r in probed:
        f, rf = r.facts, ref.facts
        skew = f.clock_offset - rf.clock_offset
        slack = f.clock_uncertainty + rf.clock_uncertainty
        if r is ref:
            out.append(
                check("clock", r.host, "pass", f"the reference clock ({f.clock_offset:+.3f}s from this machine)")
            )
        elif abs(skew) - slack > CLOCK_SKEW_WARN_S:  # beyond the error bar: surely more than a second
            out.append(
                check(
                    "clock",
                    r.host,
                    "warn",
                    f"clock is {skew:+.1f}s off {ref.host}'s: timeouts, logs and "
                    "checkpoint times disagree between hosts",
                    "run NTP on every host (timedatectl set-ntp true; chronyc tracking)",
                )
            )
        else:
            how = "" if f.ntp_error is None else f", best of {CLOCK_ROUND_TRIPS} round trips"
            out.append(
                check("clock", r.host, "pass", f"{skew * 1000:+.0f} ms from {ref.host} (±{slack * 1000:.0f} ms{how})")
            )
    return out


def master_port_check(listener: ListenerResult) -> Check:
    """MASTER_PORT is free on the master (naming the holder if not) and MASTER_ADDR is one of its addresses."""
    host, port, status = listener.host, listener.port, listener.status
    if not listener.started:
        return check("master-port", host, "skip", listener.error or "the master was not probed")
    holders = status.get("holders") or []
    if holders:
        who, pids = describe_holders(holders)
        return check(
            "master-port",
            host,
            "fail",
            f"port {port} is in use on {host}: {who}; rank 0 cannot bind it",
            (f"stop it (kill {' '.join(map(str, pids))}) " if pids else "stop it ") + f"or {_other_port(listener)}",
        )
    reason = status.get("reason")
    if status.get("bound"):
        note = f" ({listener.chosen_at_launch})" if listener.chosen_at_launch else ""
        return check("master-port", host, "pass", f"{host_port(listener.address, port)} is free on {host}{note}")
    if reason == "dns":
        return check(
            "master-port",
            host,
            "fail",
            f"MASTER_ADDR {listener.address!r} does not resolve on {host}: {status.get('error')}",
            "give --master-addr as an IP address of the master, or fix DNS / /etc/hosts on it",
        )
    if reason == "not-local":
        return check(
            "master-port",
            host,
            "fail",
            f"MASTER_ADDR {listener.address} ({status.get('address')}) is not an address of "
            f"{host}, the master (the first host): rank 0 runs there",
            f"use an address of {host} (ip -br addr on {host}) "
            "as --master-addr, or put the master's host first in the hostfile",
        )
    if reason == "denied":
        return check("master-port", host, "fail", f"port {port} needs root on {host}", _other_port(listener))
    return check(
        "master-port",
        host,
        "fail",
        f"cannot listen on {listener.address}:{port} on {host}: {status.get('error')}",
        _other_port(listener),
    )


def _other_port(listener: ListenerResult) -> str:
    """The port to use instead: one the listener found free on the master right now (never past 65535)."""
    free = listener.status.get("suggest")
    if isinstance(free, int) and 1024 <= free <= 65535:
        return f"pick a free port: --master-port {free} (free on {listener.host} now)"
    return f"pick a port that is free on {listener.host} as --master-port (none near {listener.port} was)"
