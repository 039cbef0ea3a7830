"""Steps per second of 2 engine ranks each bound to its own cores (``--cpu-bind cores``) against unbound ranks
(``--cpu-bind none``), in the same run, and the run-to-run spread of both (what binding exists to cut).

    python bench/placement.py [--rounds 3] [--steps 30] [--nproc 2] [--preset tiny]

Each round runs ``distlaunch train -n NPROC`` twice, bound and unbound, back to back in alternating order, on the
same model, batches and settings. A run's steps per second is the inverse of the median step time over its steps
2..N (rank 0's metrics: start-up excluded). Printed: the median of each side, their ratio bound / unbound, and
each side's spread (max - min over median, across rounds) with the ratio of the spreads (below 1: binding made
runs more alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDES = ("cores", "none")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=2, help="ranks, each bound to its share of the cores")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq-len", type=int, default=64)
    return parser.parse_args()


def steps_per_s(args: argparse.Namespace, bind: str, out: Path) -> float:
    """One ``distlaunch train`` job under ``--cpu-bind bind``: rank 0's steps per second after the first step."""
    metrics = out / f"metrics-{bind}.jsonl"
    metrics.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "distlaunch", "train", "-n", str(args.nproc), "--cpu-bind", bind]
    argv += ["--metrics-file", str(metrics), "--log-dir", str(out / "logs")]
    for assignment in (
        f"model.preset='{args.preset}'",
        f"train.steps={args.steps}",
        f"train.seq_len={args.seq_len}",
        f"train.global_batch_size={4 * args.nproc}",
        "train.eval_every=0",
    ):
        argv += ["--set", assignment]
    subprocess.run(argv, check=True, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    times = [r["step_time_s"] for r in rows if "step" in r and r.get("step_time_s") and r["step"] > 1]
    return 1.0 / statistics.median(times)


def spread(values: list[float]) -> float:
    """max - min over the median: how far apart the runs of one side landed."""
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    args = parse_args()
    runs: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as folder:
        for round_ in range(args.rounds):
            order = SIDES if round_ % 2 == 0 else SIDES[::-1]  # machine noise hits both sides alike
            for bind in order:
                runs[bind].append(steps_per_s(args, bind, Path(folder)))
            print(f"round {round_ + 1}: " + "  ".join(f"{s} {runs[s][-1]:.2f} steps/s" for s in SIDES), flush=True)
    bound, unbound = (statistics.median(runs[s]) for s in SIDES)
    print(f"bound (--cpu-bind cores)  {bound:8.2f} steps/s (median), spread {spread(runs['cores']):.1%}")
    print(f"unbound (--cpu-bind none) {unbound:8.2f} steps/s (median), spread {spread(runs['none']):.1%}")
    ratio = spread(runs["cores"]) / spread(runs["none"]) if spread(runs["none"]) else float("nan")
    print(f"bound / unbound: steps/s {bound / unbound:.3f}, spread {ratio:.2f}")


if __name__ == "__main__":
    main()
