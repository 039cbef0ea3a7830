"""Tokens/s of ``distlaunch train`` against a textbook torchrun + DDP loop, or a ZeRO stage against ZeRO-0.

    python bench/engine_throughput.py [--preset tiny] [--rounds 3] [--steps 30] [--precision fp32]
    python bench/engine_throughput.py --dp 5 --zero 1 --against zero0

Each round runs both, one after the other, on the same model, initial weights, batches, AdamW
settings, clipping and schedule: ``distlaunch train`` with ``--parallel dp=N,tp=1,pp=1,zero=Z``
(``--dp``, default 2; ``--zero``, default 0), and either ``torchrun --nproc-per-node N
bench/ddp_reference.py`` (``--against ddp``) or ``distlaunch train`` with ZeRO-0 (``--against
zero0``). Both time every step inside the ranks (start-up excluded) and report the median tokens/s
over steps 2..N. The two runs of a round go back to back, in alternating order; this script prints
each round's ratio engine / reference, their median (goals: against DDP at dp=2 >= 1.05 on CPU,
>= 0.95 on GPU; ZeRO-1 against ZeRO-0 at dp=5 >= 0.95) and, for comparison, the ratio of the
medians. Then one job alternates the two loops step by step in the same processes
(bench/step_interleaved.py): the median ratio of their step times, and of the CPU seconds a step
takes on all ranks together (what bounds throughput once the ranks outnumber the cores, and
steadier than wall time on a shared machine). On GPUs (one per rank) it also prints the engine's
MFU against the GPU's dense bf16 peak.
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

from distlaunch.training.config import load_config

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dp", type=int, default=2, help="ranks (all data parallel)")
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--against", default="ddp", choices=["ddp", "zero0"])
    parser.add_argument("--global-batch-size", type=int, default=None, help="default: 8 sequences per rank")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    if args.global_batch_size is None:
        args.global_batch_size = 8 * args.dp
    return args


def engine_overrides(args: argparse.Namespace, zero: int) -> list[str]:
    """The ``--set`` assignments that give the engine ddp_reference.py's run: the engine's own
    defaults, not those of the template `distlaunch train` embeds (its micro_batch_size=2 would
    split each rank's batch into 4 forward/backward passes where DDP runs one; its lr, warmup
    and weight decay differ too). One micro-batch per rank and step, as DDP runs."""
    train = load_config(None, []).train
    return [
        f"model.preset='{args.preset}'",
        f"train.steps={args.steps}",
        f"train.seq_len={args.seq_len}",
        f"train.global_batch_size={args.global_batch_size}",
        f"train.precision='{args.precision}'",
        f"train.micro_batch_size={args.global_batch_size // args.dp}",
        f"train.lr={train.lr}",
        f"train.warmup_steps={train.warmup_steps}",
        f"train.weight_decay={train.weight_decay}",
        "train.eval_every=0",
        "train.log_every=10",  # on a GPU a record is its read interval's mean; the first step is read alone
        "parallel.pp=1",
        f"parallel.zero={zero}",
        f"parallel.dp={args.dp}",
    ]


def run_engine(args: argparse.Namespace, out: Path, zero: int) -> dict:
    """One ``distlaunch train`` job; rank 0's summary record."""
    metrics = out / f"engine-zero{zero}.jsonl"
    metrics.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "distlaunch", "train", "-n", str(args.dp), "--metrics-file", str(metrics)]
    for assignment in engine_overrides(args, zero):
        argv += ["--set", assignment]
    subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return json.loads(metrics.read_text().splitlines()[-1])


def torchrun(script: str, args: argparse.Namespace, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """``torchrun --nproc-per-node DP bench/SCRIPT`` with this run's settings; rank 0's JSON result."""
    result = out / f"{Path(script).stem}.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.dp)]
    argv += [str(REPO / "bench" / script), *extra]
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


def run_reference(args: argparse.Namespace, out: Path) -> dict:
    """The reference job of a round: DDP under torchrun, or the engine with ZeRO-0."""
    if args.against == "zero0":
        return run_engine(args, out, 0)
    return torchrun("ddp_reference.py", args, out)


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
                summary = run_engine(args, out, args.zero)
                ref = run_reference(args, out)
            else:
                ref = run_reference(args, out)
                summary = run_engine(args, out, args.zero)
            engine.append(summary["tokens_per_s"])
            mfu.append(summary["mfu"])
            reference.append(ref["tokens_per_s"])
            print(
                f"round {i + 1}: engine {engine[-1]:.0f} tok/s, reference {reference[-1]:.0f} tok/s, "
                f"ratio {engine[-1] / reference[-1]:.3f}",
                flush=True,
            )
        steps = torchrun("step_interleaved.py", args, out, ("--zero", str(args.zero), "--against", args.against))
    # steps 2..N (the first includes warm-up); each pair ran back to back under the same load
    step_ratio = statistics.median(
        ref / eng for eng, ref in zip(steps["engine_s"][1:], steps["reference_s"][1:], strict=True)
    )
    cpu_ratio = statistics.median(
        ref / eng for eng, ref in zip(steps["engine_cpu_s"][1:], steps["reference_cpu_s"][1:], strict=True)
    )
    e, r = statistics.median(engine), statistics.median(reference)
    paired = statistics.median(a / b for a, b in zip(engine, reference, strict=True))
    goal = "goal >= 1.05 on CPU, 0.95 on GPU" if args.against == "ddp" else "goal >= 0.95"
    print(
        f"preset {args.preset}, {args.precision}, dp={args.dp}, zero={args.zero} against {args.against}, "
        f"global batch {args.global_batch_size} x {args.seq_len} tokens, {args.steps} steps, {args.rounds} rounds"
    )
    print(f"distlaunch train  {e:10.0f} tok/s (median)")
    print(f"{'torchrun + DDP' if args.against == 'ddp' else 'engine, ZeRO-0':<17} {r:10.0f} tok/s (median)")
    print(f"ratio             {paired:10.3f}  (median of the rounds' ratios; {goal})")
    print(f"ratio of medians  {e / r:10.3f}")
    print(
        f"step by step      {step_ratio:10.3f}  (one job alternating an engine step and a reference step, "
        f"median over {len(steps['engine_s']) - 1} pairs)"
    )
    print(f"CPU step by step  {cpu_ratio:10.3f}  (the same pairs: reference / engine CPU seconds a step, all ranks)")
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
                "cpu_step_ratio": cpu_ratio,
                "mfu": statistics.median(mfu) if all(m is not None for m in mfu) else None,
            }
        )
    )


if __name__ == "__main__":
    main()
