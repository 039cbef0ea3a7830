"""What a job of the bundled engine costs to start, warm (``--preload auto``: each host imports torch and the engine
once and forks its ranks) against cold (``--preload none``: every rank imports them) and against torchrun (every
rank imports them), measured in one invocation on the same program with the same settings.

    python bench/warm_start.py [--nproc 4] [--repeats 3] [--steps 3]

Each side trains the tiny preset for ``--steps`` steps on ``--nproc`` gloo ranks of this machine. It reports the
median wall time of the whole command and the CPU-seconds it used, itself and every process it started (ranks,
agents, the preloaded process: the kernel's count of reaped children), and the ratios warm / torchrun and
warm / cold. Runs alternate so machine noise hits every side alike.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def engine_sets(steps: int, out: Path) -> list[str]:
    """The same engine settings for every side: the default (tiny) preset, no checkpoints, metrics to ``out``."""
    sets = [f"train.steps={steps}", "checkpoint.every=0"]
    return ["--metrics-file", str(out), *(arg for s in sets for arg in ("--set", s))]


def commands(nproc: int, steps: int, out: Path) -> dict[str, list[str]]:
    distlaunch = shutil.which("distlaunch") or sys.exit("distlaunch not found: pip install -e .")
    torchrun = shutil.which("torchrun") or sys.exit("torchrun not found: pip install torch==2.13.0")
    engine = ["-m", "distlaunch.engine", *engine_sets(steps, out)]
    run = [distlaunch, "run", "-n", str(nproc), "--master-port", "auto"]
    return {
        "warm": [*run, "--preload", "auto", *engine],
        "cold": [*run, "--preload", "none", *engine],
        "torchrun": [torchrun, "--standalone", "--nproc_per_node", str(nproc), *engine],
    }


def measured(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU-seconds (user + system, the command and everything it started and reaped)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTLAUNCH_LOSS_CURVE": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(args.nproc, args.steps, Path(tmp) / "metrics.jsonl")
        for cmd in cmds.values():  # one warm-up each: the page cache, .pyc files
            measured(cmd)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
        for _ in range(args.repeats):
            for name, cmd in cmds.items():
                runs[name].append(measured(cmd))
    wall = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r[1] for r in rs) for name, rs in runs.items()}
    print(
        f"a {args.steps}-step job of the engine on {args.nproc} gloo ranks, median of {args.repeats} alternating runs"
    )
    print(f"{'':<10} {'wall s':>8} {'CPU-s':>8}")
    for name in cmds:
        print(f"{name:<10} {wall[name]:>8.2f} {cpu[name]:>8.2f}")
    for other in ("torchrun", "cold"):
        print(f"warm / {other:<9} wall {wall['warm'] / wall[other]:.2f}  CPU {cpu['warm'] / cpu[other]:.2f}")


if __name__ == "__main__":
    main()
