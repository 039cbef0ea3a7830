"""SSH fan-out: how launch time grows with the number of hosts (goal: 8 hosts ≤ 1.5 × 1 host).

    python bench/ssh_fanout.py [--repeats 7]

Starts a private sshd on 127.0.0.11-18 (tests/fixtures/sshd.py), then launches a trivial rank (one per
host, no torch) on 1, 4 and 8 loopback hosts with ``distlaunch run``. For each launch it measures the
time until every rank has started (the latest rank's first line of Python, from the launcher's start)
and the launcher's total wall time. Host counts alternate so machine noise hits all alike; prints
medians and the 8-host / 1-host ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the test fixtures (a real sshd) import as in the suite: from the repository root and from tests/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fixtures.sshd import start_sshd

HOST_COUNTS = (1, 4, 8)
RANK = "import time; print('STARTED', time.time(), flush=True)"
GOAL = 1.5


def launch(cluster, hostfile: Path) -> tuple[float, float, float]:
    """One launch: (seconds until every rank started, total seconds, the launcher's own CPU seconds)."""
    cmd = [
        "distlaunch",
        "run",
        "-H",
        str(hostfile),
        "--ssh-config",
        str(cluster.ssh_config),
        "--no-python",
        sys.executable,
        "-c",
        RANK,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}).stdout
    total = time.time() - began
    # the launcher and its OpenSSH clients (its children): remote agents are sshd's children.
    # bench/launch_fanout_cpu.py tells the launcher's own CPU from its clients'.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    starts = [float(line.split("STARTED ", 1)[1]) for line in out.splitlines() if "STARTED " in line]
    return max(starts) - began, total, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="distlaunch-fanout-") as tmp:
        cluster = start_sshd(Path(tmp) / "sshd", nhosts=max(HOST_COUNTS))
        try:
            hostfiles = {n: cluster.write_hostfile(Path(tmp) / f"hosts{n}", n, slots=1) for n in HOST_COUNTS}
            for n in HOST_COUNTS:  # warm-up: page cache, .pyc files
                launch(cluster, hostfiles[n])
            started: dict[int, list[float]] = {n: [] for n in HOST_COUNTS}
            total: dict[int, list[float]] = {n: [] for n in HOST_COUNTS}
            cpu: dict[int, list[float]] = {n: [] for n in HOST_COUNTS}
            for _ in range(args.repeats):
                for n in HOST_COUNTS:
                    s, t, c = launch(cluster, hostfiles[n])
                    started[n].append(s)
                    total[n].append(t)
                    cpu[n].append(c)
        finally:
            cluster.stop()
    print(f"SSH fan-out, 1 rank per loopback host, median of {args.repeats} alternating runs")
    print(f"{'hosts':>5} {'all ranks started':>18} {'total':>8} {'launcher+ssh CPU':>17}")
    for n in HOST_COUNTS:
        print(
            f"{n:>5} {statistics.median(started[n]):>17.3f}s {statistics.median(total[n]):>7.3f}s "
            f"{statistics.median(cpu[n]):>16.3f}s"
        )
    for label, series in (("all ranks started", started), ("total", total)):
        ratio = statistics.median(series[8]) / statistics.median(series[1])
        print(f"ratio 8/1 hosts ({label}): {ratio:.2f}  goal <= {GOAL} {'ok' if ratio <= GOAL else 'MISSED'}")
    # On one machine the simulated hosts' own work (sshd login, agent and rank interpreters) shares its
    # cores; on a real cluster it runs on every host at once. The launcher's CPU is what distlaunch adds.
    print(
        f"launcher+ssh CPU 8/1 hosts: {statistics.median(cpu[8]) / statistics.median(cpu[1]):.2f}  "
        f"(machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end)"
    )


if __name__ == "__main__":
    main()
