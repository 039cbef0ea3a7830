"""Doctor scaling: how long ``distlaunch doctor`` takes on 1 vs 8 healthy hosts (goal: 8 hosts ≤ 1.5 × 1 host,
and under 3 s).

    python bench/doctor_scaling.py [--repeats 7]

Starts a private sshd on 127.0.0.11-18 (tests/fixtures/sshd.py) and runs the real command,
``distlaunch doctor -H HOSTFILE --ssh-config … --json``, as a user does (interpreter start included),
on 1 and 8 loopback hosts, alternating so machine noise hits both alike. Every run must report ok
(a doctor that is fast because it failed early would prove nothing). Prints medians of wall time and
of the doctor process's own CPU time, and the wall-time ratio.
"""

from __future__ import annotations

import argparse
import json
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

from distlaunch.contract.endpoint import free_port

HOST_COUNTS = (1, 8)
RATIO_GOAL = 1.5
SECONDS_GOAL = 3.0


def doctor(cluster, hostfile: Path) -> tuple[float, float]:
    """One doctor run: (wall seconds, CPU seconds of the doctor process itself); it must pass."""
    cmd = [
        sys.executable,
        "-m",
        "distlaunch",
        "doctor",
        "-H",
        str(hostfile),
        "--ssh-config",
        str(cluster.ssh_config),
        "--master-port",
        str(free_port("127.0.0.11")),
        "--json",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    elapsed = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads(done.stdout)
    if done.returncode != 0 or not report["ok"]:
        failed = [c for c in report["checks"] if c["status"] == "fail"]
        raise SystemExit(f"doctor failed on a healthy cluster: {failed}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="distlaunch-doctor-bench-") as tmp:
        cluster = start_sshd(Path(tmp) / "sshd", nhosts=max(HOST_COUNTS))
        try:
            hostfiles = {n: cluster.write_hostfile(Path(tmp) / f"hosts{n}", n, slots=1) for n in HOST_COUNTS}
            for n in HOST_COUNTS:  # warm-up: page cache, .pyc files
                doctor(cluster, hostfiles[n])
            times: dict[int, list[float]] = {n: [] for n in HOST_COUNTS}
            cpus: dict[int, list[float]] = {n: [] for n in HOST_COUNTS}
            for _ in range(args.repeats):
                for n in HOST_COUNTS:
                    wall, cpu = doctor(cluster, hostfiles[n])
                    times[n].append(wall)
                    cpus[n].append(cpu)
        finally:
            cluster.stop()
    medians = {n: statistics.median(t) for n, t in times.items()}
    for n in HOST_COUNTS:
        print(
            f"{n} host(s): median {medians[n]:.2f} s  (min {min(times[n]):.2f}, max {max(times[n]):.2f}, {args.repeats} runs); "
            f"doctor's own CPU median {statistics.median(cpus[n]):.2f} s"
        )
    ratio = medians[8] / medians[1]
    verdict = "meets" if ratio <= RATIO_GOAL and medians[8] < SECONDS_GOAL else "MISSES"
    print(
        f"8 hosts / 1 host = {ratio:.2f} (goal <= {RATIO_GOAL}, and 8 hosts < {SECONDS_GOAL:g} s): {verdict} the goal"
    )
    # The "hosts" and their sshd share this machine's cores: under load, their CPU (not the doctor's) sets the pace.
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
