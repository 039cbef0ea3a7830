"""Wall time of ``distlaunch run -n N`` against ``torchrun --nproc_per_node N``, and of the CLI's start against
its floors, measured in one invocation.

    python bench/launch_overhead.py [--repeats 7] [--nproc 4]

Against torchrun, two workloads: (a) a script that never imports torch (pure launcher overhead) and (b) gloo
init + barrier (goals: distlaunch / torchrun (a) <= 0.5, (b) <= 0.9). Against the floors: (c) ``distlaunch run
-n N noop.py`` against a shell loop that starts the same N interpreters with the same environment and waits for
them (goal <= 3), and (d) ``distlaunch --help`` against ``python -c "import typer"`` (goal <= 2). Runs alternate
so machine noise hits both sides alike; medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent / "scripts"


def timed(cmd: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def commands(script: Path, nproc: int) -> dict[str, list[str]]:
    torchrun = shutil.which("torchrun") or sys.exit("torchrun not found: pip install torch==2.13.0")
    distlaunch = shutil.which("distlaunch") or sys.exit("distlaunch not found: pip install -e .")
    return {
        "distlaunch": [distlaunch, "run", "-n", str(nproc), "--master-port", "auto", str(script)],
        "torchrun": [torchrun, "--standalone", "--nproc_per_node", str(nproc), str(script)],  # standalone: a free port
    }


def floors(nproc: int) -> list[tuple[str, dict[str, list[str]], float]]:
    """(c) and (d): each pair as (label, {ours, floor}, goal)."""
    distlaunch = shutil.which("distlaunch") or sys.exit("distlaunch not found: pip install -e .")
    noop = HERE / "noop.py"
    # the floor: what any launcher must do at least, N interpreters started with the rank environment
    loop = (
        f"for r in $(seq 0 {nproc - 1}); do RANK=$r LOCAL_RANK=$r WORLD_SIZE={nproc} LOCAL_WORLD_SIZE={nproc}"
        f" MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 {sys.executable} {noop} & done; wait"
    )
    return [
        (f"(c) run -n {nproc} vs shell loop", {"distlaunch": [distlaunch, "run", "-n", str(nproc), str(noop)],
                                             "floor": ["bash", "-c", loop]}, 3.0),
        ("(d) --help vs import typer", {"distlaunch": [distlaunch, "--help"],
                                        "floor": [sys.executable, "-c", "import typer"]}, 2.0),
    ]  # fmt: skip


def measure(script: Path | dict[str, list[str]], nproc: int, repeats: int) -> dict[str, float]:
    cmds = script if isinstance(script, dict) else commands(script, nproc)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for cmd in cmds.values():  # one warm-up each: page cache, .pyc files
        timed(cmd)
    for _ in range(repeats):
        for name, cmd in cmds.items():
            times[name].append(timed(cmd))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    print(f"launch overhead, {args.nproc} processes, median of {args.repeats} alternating runs")
    print(f"{'workload':<28} {'distlaunch':>11} {'torchrun':>10} {'ratio':>7}  goal")
    for label, script, goal in (
        ("(a) no torch import", HERE / "noop.py", 0.5),
        ("(b) gloo init + barrier", HERE / "barrier.py", 0.9),
    ):
        m = measure(script, args.nproc, args.repeats)
        ratio = m["distlaunch"] / m["torchrun"]
        verdict = "ok" if ratio <= goal else "MISSED"
        print(f"{label:<28} {m['distlaunch']:>10.3f}s {m['torchrun']:>9.3f}s {ratio:>7.2f}  <= {goal} {verdict}")
    print(f"{'start-up':<28} {'distlaunch':>11} {'floor':>10} {'ratio':>7}  goal")
    for label, cmds, goal in floors(args.nproc):
        m = measure(cmds, args.nproc, args.repeats)
        ratio = m["distlaunch"] / m["floor"]
        verdict = "ok" if ratio <= goal else "MISSED"
        print(f"{label:<28} {m['distlaunch']:>10.3f}s {m['floor']:>9.3f}s {ratio:>7.2f}  <= {goal} {verdict}")


if __name__ == "__main__":
    main()
