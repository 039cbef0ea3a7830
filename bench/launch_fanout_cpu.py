"""Launcher CPU per SSH host, its CPU while every rank idles, and its memory per host, for both transports,
measured in one run (goals: <= 5 ms of launcher CPU per host between 1 and 64 hosts; <= 2% of one core at 64
hosts in the steady state; resident memory growing <= 1 MiB per host).

    python bench/launch_fanout_cpu.py [--hosts 1,16,32,64] [--repeats 3] [--idle-s 20]

Starts 4 private sshd daemons on 127.0.1.11 … 127.0.4.26 (tests/fixtures/sshd.py, 16 addresses each) and runs
``distlaunch run`` through bench/_probe_launcher.py, one trivial rank per host (``python -c``, no torch), with the
OpenSSH transport (the default) and, as the reference, the paramiko one (DISTLAUNCH_SSH_TRANSPORT=paramiko),
alternating. "Launcher CPU" is the launcher process's own (all its threads); the OpenSSH clients it starts are
separate processes, whose CPU is printed beside it ("ssh clients"). Per host = the least-squares slope of the
medians over the host counts. The steady state: 64 ranks that sleep, the launcher's CPU over --idle-s seconds
once all have started (default --heartbeat-timeout 30: a ping each way every 10 s), its threads and RSS.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _fleet import FleetLaunch, pss_kib, start_fleet, usage

TRANSPORTS = ("openssh", "paramiko")
CPU_GOAL_MS = 5.0
IDLE_GOAL_PCT = 2.0
RSS_GOAL_MIB = 1.0


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def launches(fleet, hosts: list[int], repeats: int) -> dict[str, dict[int, list[dict]]]:
    """Every (transport, host count) ``repeats`` times, alternating, after one warm-up each."""
    results: dict[str, dict[int, list[dict]]] = {t: {n: [] for n in hosts} for t in TRANSPORTS}
    for transport in TRANSPORTS:
        FleetLaunch(fleet, hosts[-1], 0, transport=transport).finish()  # page cache, .pyc files, known sockets
    for _ in range(repeats):
        for n in hosts:
            for transport in TRANSPORTS:
                launch = FleetLaunch(fleet, n, 0, transport=transport)
                started = launch.wait_started(300)
                report = launch.finish()
                if report["rc"] != 0:
                    raise RuntimeError(f"{transport} on {n} hosts ended with {report['rc']}: {''.join(launch.err)}")
                results[transport][n].append({**report, "started_s": started})
    return results


def idle(fleet, nhosts: int, transport: str, idle_s: float) -> dict:
    """Launcher CPU share, threads and RSS while ``nhosts`` ranks sleep; the ssh clients' CPU and PSS beside."""
    launch = FleetLaunch(fleet, nhosts, idle_s + 60, transport=transport, env={"DISTLAUNCH_PROBE_EVERY_S": "0.5"})
    try:
        launch.wait_started(300)
        time.sleep(3)  # the start's last events handled
        clients = launch.ssh_clients()
        before, clients_before = usage(launch.proc.pid), sum(usage(c).cpu_s for c in clients)
        threads_before, began = launch.cpu_by_thread(), time.monotonic()
        time.sleep(idle_s)
        after, clients_after = usage(launch.proc.pid), sum(usage(c).cpu_s for c in clients)
        threads_after = launch.cpu_by_thread()
        took = time.monotonic() - began
        return {
            "by_thread_pct": {k: 100 * (v - threads_before.get(k, 0.0)) / took for k, v in threads_after.items()},
            "cpu_pct": 100 * (after.cpu_s - before.cpu_s) / took,
            "clients_cpu_pct": 100 * (clients_after - clients_before) / took,
            "threads": after.threads,
            "rss_mib": after.rss_kib / 1024,
            "clients_pss_mib": sum(pss_kib(c) for c in clients) / 1024,
        }
    finally:
        launch.proc.terminate()  # our own child: SIGTERM stops the job in order
        launch.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,16,32,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=20.0)
    args = parser.parse_args()
    hosts = sorted(int(n) for n in args.hosts.split(","))
    with tempfile.TemporaryDirectory(prefix="distlaunch-fanout-cpu-") as tmp:
        fleet = start_fleet(Path(tmp) / "fleet", hosts[-1])
        try:
            results = launches(fleet, hosts, args.repeats)
            steady = {t: {n: idle(fleet, n, t, args.idle_s) for n in (hosts[0], hosts[-1])} for t in TRANSPORTS}
        finally:
            fleet.stop()
    report(results, steady, hosts, args)


def report(results, steady, hosts: list[int], args) -> None:
    med = {t: {n: {k: statistics.median(r[k] for r in results[t][n]) for k in ("cpu_s", "children_cpu_s", "started_s", "wall_s", "hwm_kib")} for n in hosts} for t in TRANSPORTS}  # fmt: skip
    print(f"launch of one trivial rank per loopback host, median of {args.repeats} alternating runs")
    print(
        f"{'transport':<9} {'hosts':>5} {'launcher CPU':>13} {'ssh clients':>12} {'all started':>12} {'total':>8} {'peak RSS':>9}"
    )
    for t in TRANSPORTS:
        for n in hosts:
            m = med[t][n]
            print(
                f"{t:<9} {n:>5} {m['cpu_s']:>12.3f}s {m['children_cpu_s']:>11.3f}s {m['started_s']:>11.2f}s "
                f"{m['wall_s']:>7.2f}s {m['hwm_kib'] / 1024:>7.1f}Mi"
            )
    per_host = {t: 1000 * slope(hosts, [med[t][n]["cpu_s"] for n in hosts]) for t in TRANSPORTS}
    clients = {t: 1000 * slope(hosts, [med[t][n]["children_cpu_s"] for n in hosts]) for t in TRANSPORTS}
    ours, ref = per_host["openssh"], per_host["paramiko"]
    print(f"launcher CPU per host, {hosts[0]}-{hosts[-1]} hosts (slope):")
    for t in TRANSPORTS:
        verdict = "ok" if per_host[t] <= CPU_GOAL_MS else "MISSED"
        print(
            f"  {t:<9} {per_host[t]:6.2f} ms  = {per_host[t] / CPU_GOAL_MS:.2f} x the goal ({CPU_GOAL_MS:g} ms) {verdict}; ssh clients {clients[t]:.2f} ms"
        )
    print(f"  openssh / paramiko: {ours / ref:.2f}")
    print(f"steady state, ranks sleeping, over {args.idle_s:g}s:")
    for t in TRANSPORTS:
        lo, hi = steady[t][hosts[0]], steady[t][hosts[-1]]
        rss_per_host = (hi["rss_mib"] - lo["rss_mib"]) / (hosts[-1] - hosts[0])
        cpu_verdict = "ok" if hi["cpu_pct"] <= IDLE_GOAL_PCT else "MISSED"
        rss_verdict = "ok" if rss_per_host <= RSS_GOAL_MIB else "MISSED"
        print(
            f"  {t:<9} {hosts[-1]} hosts: launcher {hi['cpu_pct']:.2f}% of a core = {hi['cpu_pct'] / IDLE_GOAL_PCT:.2f} x "
            f"the goal ({IDLE_GOAL_PCT:g}%) {cpu_verdict} ({lo['cpu_pct']:.2f}% at {hosts[0]}: "
            f"{1000 * (hi['cpu_pct'] - lo['cpu_pct']) / (hosts[-1] - hosts[0]):.1f} thousandths of a percent per host); "
            f"{hi['threads']} threads ({lo['threads']} at {hosts[0]}); "
            f"RSS {hi['rss_mib']:.1f} MiB, {rss_per_host * 1024:.0f} KiB per host = {rss_per_host / RSS_GOAL_MIB:.2f} x "
            f"the goal ({RSS_GOAL_MIB:g} MiB) {rss_verdict}; ssh clients {hi['clients_cpu_pct']:.2f}% CPU, "
            f"{hi['clients_pss_mib']:.1f} MiB PSS"
        )
        shares = ", ".join(f"{k} {v:.2f}%" for k, v in sorted(hi["by_thread_pct"].items(), key=lambda kv: -kv[1]))
        print(f"    where: {shares}")
    o, p = steady["openssh"][hosts[-1]], steady["paramiko"][hosts[-1]]
    print(
        f"  openssh / paramiko at {hosts[-1]} hosts: CPU {o['cpu_pct'] / max(p['cpu_pct'], 1e-9):.2f}, threads {o['threads'] / p['threads']:.2f}"
    )


if __name__ == "__main__":
    main()
