"""A scale rehearsal on this machine: 64, 128 and 256 SSH hosts (real sshd daemons on 127.0.x.y, 16 loopback
addresses each), one rank per host that imports no torch, prints a line and sleeps.

    python bench/scale_rehearsal.py [--hosts 64,128,256] [--idle-s 20] [--heartbeat-timeout 30]

For each host count it prints the time until every rank has started; the launcher's CPU (until then, and its
share of one core while the ranks idle), threads and RSS; then it kills one host for real (SIGKILL to that
host's sshd session and everything below it: login shell, agent, ranks) and prints the time until the launcher
says it stops every rank (the host's loss detected), until it has stopped every rank everywhere and exited,
its exit code, and how many processes of the job are left (ranks, agents and ssh clients carry its id). Here
the stop grows with the hosts because every agent ends by looking for its ranks' stray processes in /proc,
which on this machine holds every simulated host's processes; on a cluster each host's holds its own. At the largest count
it also freezes one host (SIGSTOP to the same tree: no connection closes) and prints the time until it is given
up, against the heartbeat bound (the timeout plus the third of it between two checks).

It then EXTRAPOLATES to 1,024 and 4,096 hosts from the measured slope (least squares over the host counts):
these are projections from this machine, not measurements. Here every simulated host's own work (its sshd, its
login, its agent's and its rank's interpreters, and each host's ssh client) shares the same two cores as the
launcher, so the wall times say more about this machine than about a cluster; the launcher's CPU and memory are
what the launcher itself costs wherever it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from _fleet import FleetLaunch, job_processes, session_of, start_fleet, usage

EXTRAPOLATE_TO = (1024, 4096)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares: (slope, intercept)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            os.kill(pid, sig)


def rehearse(fleet, nhosts: int, idle_s: float, heartbeat_s: float, freeze: bool) -> dict:
    """One launch on ``nhosts`` hosts: started, idle, then one host killed (or frozen) until the launcher ends."""
    launch = FleetLaunch(fleet, nhosts, 3600, "--heartbeat-timeout", f"{heartbeat_s:g}", "--grace-period", "1")
    try:
        started_s = launch.wait_started(900)
        at_start = usage(launch.proc.pid)
        time.sleep(5)  # the start's last events handled, the hosts' own start-up work done
        before, began = usage(launch.proc.pid), time.monotonic()
        time.sleep(idle_s)
        after = usage(launch.proc.pid)
        idle_pct = 100 * (after.cpu_s - before.cpu_s) / (time.monotonic() - began)
        victim = fleet.aliases[nhosts // 2]
        tree = session_of(fleet, victim)
        if not tree:
            raise RuntimeError(f"no sshd session serves {victim}")
        hit = time.monotonic()
        signal_all(tree, signal.SIGSTOP if freeze else signal.SIGKILL)
        report = launch.finish(300)
        stop_s = time.monotonic() - hit
        detect_s = (launch.stopping_at or math.nan) - hit
        if freeze:
            signal_all(tree, signal.SIGCONT)  # thawed, that host's agent reads EOF and stops its ranks
        deadline = time.monotonic() + 30
        while job_processes(launch.job_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        return {
            "hosts": nhosts,
            "started_s": started_s,
            "cpu_at_start_s": at_start.cpu_s,
            "idle_pct": idle_pct,
            "threads": after.threads,
            "rss_mib": after.rss_kib / 1024,
            "stop_s": stop_s,
            "detect_s": detect_s,
            "rc": report["rc"],
            "cpu_s": report["cpu_s"],
            "clients_cpu_s": report["children_cpu_s"],
            "left": len(job_processes(launch.job_id)),
            "victim": victim,
            "load": os.getloadavg()[0],
        }
    finally:
        if launch.proc.poll() is None:
            launch.proc.kill()  # our own child, by its handle
            launch.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="64,128,256")
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--heartbeat-timeout", type=float, default=30.0)
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.hosts.split(","))
    with tempfile.TemporaryDirectory(prefix="distlaunch-scale-") as tmp:
        t = time.monotonic()
        fleet = start_fleet(Path(tmp) / "fleet", counts[-1])
        print(f"{len(fleet.daemons)} sshd daemons, {counts[-1]} hosts, up in {time.monotonic() - t:.1f}s", flush=True)
        print(f"{'hosts':>5} {'all started':>12} {'launcher CPU':>13} {'idle CPU':>9} {'threads':>8} {'RSS':>9} "
              f"{'kill -> stop':>13} {'-> exit':>8} {'code':>5} {'left':>5} {'load':>5}", flush=True)  # fmt: skip
        runs = []
        try:
            for n in counts:
                runs.append(rehearse(fleet, n, args.idle_s, args.heartbeat_timeout, freeze=False))
                row(runs[-1])
            frozen = rehearse(fleet, counts[-1], args.idle_s, args.heartbeat_timeout, freeze=True)
        finally:
            fleet.stop()
    summary(runs, frozen, args)


def row(r: dict) -> None:
    print(
        f"{r['hosts']:>5} {r['started_s']:>11.1f}s {r['cpu_at_start_s']:>12.2f}s {r['idle_pct']:>8.2f}% "
        f"{r['threads']:>8} {r['rss_mib']:>7.1f}Mi {r['detect_s']:>12.1f}s {r['stop_s']:>7.1f}s {r['rc']:>5} {r['left']:>5} "
        f"{r['load']:>5.1f}",
        flush=True,
    )


def summary(runs: list[dict], frozen: dict, args) -> None:
    bound = args.heartbeat_timeout * 4 / 3
    print(
        f"frozen host ({frozen['victim']} of {frozen['hosts']}): given up after {frozen['detect_s']:.1f}s, against "
        f"the heartbeat bound {bound:.1f}s (--heartbeat-timeout {args.heartbeat_timeout:g} + a third between checks): "
        f"ratio {frozen['detect_s'] / bound:.2f}; every rank stopped and the launcher gone after "
        f"{frozen['stop_s']:.1f}s, exit {frozen['rc']}; left {frozen['left']}"
    )
    xs = [r["hosts"] for r in runs]
    print(f"EXTRAPOLATED from {', '.join(map(str, xs))} hosts (least squares; projections, not measurements):")
    for label, key, scale, per_host, unit in (
        ("all ranks started (this machine's 2 cores do every host's work)", "started_s", 1000, "ms", "s"),
        ("launcher CPU until every rank started", "cpu_at_start_s", 1000, "ms", "s"),
        ("launcher CPU while the ranks idle", "idle_pct", 1, "% of a core", "% of a core"),
        ("launcher RSS", "rss_mib", 1024, "KiB", " MiB"),
    ):
        slope, intercept = fit(xs, [r[key] for r in runs])
        projected = ", ".join(f"{n} hosts {slope * n + intercept:.2f}{unit}" for n in EXTRAPOLATE_TO)
        print(f"  {label}: {slope * scale:.3f} {per_host} per host -> {projected}")


if __name__ == "__main__":
    main()
