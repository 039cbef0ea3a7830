"""Tokens/s of ``distlaunch train`` (dp=2) against a textbook torchrun + DDP loop, same invocation.

    python bench/engine_throughput.py [--preset tiny] [--rounds 3] [--steps 30] [--precision fp32]

Each round runs both, one after the other, on the same model, initial weights, batches, AdamW
settings, clipping and schedule: ``distlaunch train`` with ``--parallel dp=2,tp=1,pp=1,zero=0``,
and ``torchrun --nproc-per-node 2 bench/ddp_reference.py``. Both time every step inside the
ranks (start-up excluded) and report the median tokens/s over steps 2..N. The two runs of a round
go back to back, in alternating order; this script prints each round's ratio engine / reference,
their median (goal: >= 1.0 on CPU, >= 0.95 on GPU) and, for comparison, the ratio of the medians.
On GPUs (one per rank) it also prints the engine's MFU against the GPU's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from distlaunch.engine.config import load_config

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    return parser.parse_args()


def engine_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` assignments that give the engine ddp_reference.py's run: the engine's own
    defaults, not those of the template `distlaunch train` embeds (its micro_batch_size=2 would
    split each rank's batch into 4 forward/backward passes where DDP runs one; its lr, warmup
    and weight decay differ too)."""
    train = load_config(None, []).train
    return [
        f"model.preset='{args.preset}'",
        f"train.steps={args.steps}",
        f"train.seq_len={args.seq_len}",
        f"train.global_batch_size={args.global_batch_size}",
        f"train.precision='{args.precision}'",
        f"train.micro_batch_size={args.global_batch_size // 2}",
        f"train.lr={train.lr}",
        f"train.warmup_steps={train.warmup_steps}",
        f"train.weight_decay={train.weight_decay}",
        "train.eval_every=0",
        "train.log_every=10",  # on a GPU a record is its read interval's mean; the first step is read alone
        "parallel.pp=1",
        "parallel.zero=0",
        "parallel.dp=2",
    ]


def run_engine(args: argparse.Namespace, out: Path) -> dict:
    """One ``distlaunch train`` job; rank 0's summary record."""
    metrics = out / "engine.jsonl"
    metrics.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "distlaunch", "train", "-n", "2", "--metrics-file", str(metrics)]
    for assignment in engine_overrides(args):
        argv += ["--set", assignment]
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return json.loads(metrics.read_text().splitlines()[-1])


def torchrun(script: str, args: argparse.Namespace, out: Path) -> dict:
    """``torchrun --nproc-per-node 2 bench/SCRIPT`` with this run's settings; rank 0's JSON result."""
    result = out / f"{Path(script).stem}.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(REPO / "bench" / script)]
    argv += ["--preset", args.preset, "--steps", str(args.steps), "--global-batch-size", str(args.global_batch_size)]
    argv += ["--seq-len", str(args.seq_len), "--precision", args.precision, "--out", str(result)]
    # torchrun sets OMP_NUM_THREADS=1 for multi-process jobs, as distlaunch does
    subprocess.run(
        argv,
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    return json.loads(result.read_text())


def main() -> None:
    args = parse_args()
    engine, reference, mfu = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for i in range(args.rounds):
            # a round is a pair run back to back, and the pair's order alternates: the machine's
            # speed drifts by more than the difference measured (shared VMs: ±10% between rounds),
            # so each ratio compares two runs under the same load, and neither side always goes first
            if i % 2 == 0:
                summary = run_engine(args, out)
                ref = torchrun("ddp_reference.py", args, out)
            else:
                ref = torchrun("ddp_reference.py", args, out)
                summary = run_engine(args, out)
            engine.append(summary["tokens_per_s"])
            mfu.append(summary["mfu"])
            reference.append(ref["tokens_per_s"])
            print(
                f"round {i + 1}: engine {engine[-1]:.0f} tok/s, reference {reference[-1]:.0f} tok/s, "
                f"ratio {engine[-1] / reference[-1]:.3f}",
                flush=True,
            )
        steps = torchrun("step_interleaved.py", args, out)
    # steps 2..N (the first includes warm-up); each pair ran back to back under the same load
    step_ratio = statistics.median(
        ref / eng for eng, ref in zip(steps["engine_s"][1:], steps["reference_s"][1:], strict=True)
    )
    e, r = statistics.median(engine), statistics.median(reference)
    paired = statistics.median(a / b for a, b in zip(engine, reference, strict=True))
    print(
        f"preset {args.preset}, {args.precision}, dp=2, global batch {args.global_batch_size} x {args.seq_len} tokens, "
        f"{args.steps} steps, {args.rounds} rounds"
    )
    print(f"distlaunch train  {e:10.0f} tok/s (median)")
    print(f"torchrun + DDP    {r:10.0f} tok/s (median)")
    print(f"ratio             {paired:10.3f}  (median of the rounds' ratios; goal >= 1.0 on CPU, 0.95 on GPU)")
    print(f"ratio of medians  {e / r:10.3f}")
    print(
        f"step by step      {step_ratio:10.3f}  (one job alternating an engine step and a DDP step, "
        f"median over {len(steps['engine_s']) - 1} pairs)"
    )
    if all(m is not None for m in mfu):
        print(f"engine MFU        {statistics.median(mfu):10.1%}")
    print(
        json.dumps(
            {
                "engine_tokens_per_s": e,
                "reference_tokens_per_s": r,
                "ratio": paired,
                "ratio_of_medians": e / r,
                "step_ratio": step_ratio,
                "mfu": statistics.median(mfu) if all(m is not None for m in mfu) else None,
            }
        )
    )


if __name__ == "__main__":
    main()
