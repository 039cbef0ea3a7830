"""Steps lost to a preemption or a time limit: distlaunch beside torchrun, measured in the same run.

    python bench/preemption.py [--every 20] [--repeats 3]

One `distlaunch train`-equivalent job per case: 2 CPU ranks of the engine (dp=2, the tiny model, a checkpoint
every --every steps, rank 0 slowed so a step takes about a tenth of a second), signalled once it has passed a
step chosen at random between two periodic checkpoints (the same steps for every tool):

- distlaunch, the save signal (SIGUSR1, what `#SBATCH --signal=B:USR1@LEAD` sends before a time limit);
- distlaunch, SIGTERM (a preemption) with a 10 s grace period;
- torchrun, SIGTERM: it passes the signal on to its workers, which end; the next start resumes from the last
  periodic checkpoint.

For each: the steps the next start must train again (the last step reached minus the checkpoint it resumes
from), the time from the signal to the launcher's exit, and its exit code. The summary prints the mean steps
lost per case and distlaunch's over torchrun's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}


def engine_args(ckpt: Path, metrics: Path, every: int) -> list[str]:
    sets = [
        "model.preset='tiny'",
        "train.steps=100000",
        "train.global_batch_size=4",
        "train.seq_len=32",
        "train.log_every=1",
        f"checkpoint.dir='{ckpt}'",
        f"checkpoint.every={every}",
        "fault.rank=0",
        "fault.kind='slow'",
        "fault.step=1",
        "fault.factor=10",
    ]
    return ["-m", "distlaunch.engine", "--metrics-file", str(metrics), *[a for s in sets for a in ("--set", s)]]


def last_step(metrics: Path) -> int:
    """The newest step in the metrics file (a last line still being written is left for the next look)."""
    steps = []
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "step" in record:
            steps.append(record["step"])
    return max(steps, default=0)


def resumes_from(ckpt: Path) -> int:
    latest = ckpt / "latest"
    return int(latest.read_text().strip().removeprefix("step_")) if latest.exists() else 0


def one(tool: str, sig: signal.Signals, at_step: int, every: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="dl-bench-preempt-") as tmp:
        ckpt, metrics = Path(tmp) / "ckpt", Path(tmp) / "metrics.jsonl"
        args = engine_args(ckpt, metrics, every)
        if tool == "torchrun":
            argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *args]
        else:
            argv = [sys.executable, "-m", "distlaunch", "run", "-n", "2", "--grace-period", "10", *args]
        env = {**ENV, "DISTLAUNCH_STATE_DIR": str(Path(tmp) / "state")}
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp)
        try:
            while not metrics.exists() or last_step(metrics) < at_step:
                if proc.poll() is not None:
                    raise RuntimeError(f"{tool} ended before step {at_step} (exit {proc.returncode})")
                time.sleep(0.02)
            sent = time.monotonic()
            proc.send_signal(sig)
            code = proc.wait(timeout=120)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reached, resumed = last_step(metrics), resumes_from(ckpt)
        return {"lost": reached - resumed, "reached": reached, "resumes_from": resumed, "exit": code, "s": took}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=20, help="periodic checkpoint interval (steps)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(7)
    cases = [
        ("distlaunch", signal.SIGUSR1, "distlaunch, save signal (SIGUSR1)"),
        ("distlaunch", signal.SIGTERM, "distlaunch, SIGTERM, 10 s grace"),
        ("torchrun", signal.SIGTERM, "torchrun, SIGTERM"),
    ]
    # after the first periodic checkpoint (so its save is timed), between two of them
    steps = [args.every + rng.randrange(3, args.every - 2) for _ in range(args.repeats)]
    results: dict[str, list[dict]] = {label: [] for *_, label in cases}
    for at_step in steps:
        for tool, sig, label in cases:
            result = one(tool, sig, at_step, args.every)
            results[label].append(result)
            print(
                f"{label:36s} signalled after step {at_step}: reached {result['reached']}, resumes from "
                f"{result['resumes_from']}, lost {result['lost']} step(s); exit {result['exit']} "
                f"{result['s']:.1f}s after the signal",
                flush=True,
            )
    print()
    mean = {label: sum(r["lost"] for r in rs) / len(rs) for label, rs in results.items()}
    for label, lost in mean.items():
        print(f"{label:36s} mean steps lost {lost:5.1f}")
    reference = mean["torchrun, SIGTERM"]
    for label in ("distlaunch, save signal (SIGUSR1)", "distlaunch, SIGTERM, 10 s grace"):
        ratio = mean[label] / reference if reference else float("nan")
        print(f"{label} / torchrun: {ratio:.2f} of the steps lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
