"""ZeRO stages 0-3 on 4 ranks: measured state bytes per rank next to the ZeRO formula; or, with
``--peaks``, each ZeRO-3 rank's peak resident memory against one process training the same model.

    python bench/zero_memory.py [--preset small] [--ranks 4]
    python bench/zero_memory.py --peaks [--preset 125m] [--ranks 4]

``--peaks`` runs the job at ZeRO-3 and the same job in one process (two steps each) and prints,
from each summary's ``init_peak_per_rank`` and ``peak_per_rank``, every rank's peak resident
memory (RSS) until its model was built and over the run, each as a ratio to the one process's
(goal for the run's peak: at most 0.45). RSS includes what importing torch costs every process
(measured here too, and printed), so the line below the table also gives the ratio without it.

Each stage is a real 4-process gloo job of ``python -m distlaunch.engine`` (one training step);
every rank measures the bytes of its parameters, gradients and optimizer state from the tensors'
storages after the step, and rank 0's summary line carries all ranks' numbers.

The paper's formula is for mixed precision (fp16 params and grads, 12 bytes of fp32 master
weights + Adam moments per parameter: 16Ψ). The engine measures here in fp32 with AdamW, whose
state is the two moments only (fp32 params are their own master copy), so per parameter:
params 4, grads 4, Adam 8 = 16Ψ, and with N dp ranks:

    zero=0  4Ψ + 4Ψ + 8Ψ          = 16Ψ
    zero=1  4Ψ + 4Ψ + 8Ψ/N
    zero=2  4Ψ + 4Ψ/N + 8Ψ/N
    zero=3  4Ψ/N + 4Ψ/N + 8Ψ/N    = 16Ψ/N
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from distlaunch.contract.endpoint import free_port

REPO = Path(__file__).resolve().parents[1]


def formula(zero: int, psi: int, n: int) -> dict[str, float]:
    """fp32 AdamW bytes per rank for ZeRO stage ``zero`` (see the module docstring)."""
    return {
        "params": 4 * psi / (n if zero >= 3 else 1),
        "grads": 4 * psi / (n if zero >= 2 else 1),
        "optimizer": 8 * psi / (n if zero >= 1 else 1),
    }


def run_stage(zero: int, preset: str, ranks: int, out: Path, steps: int = 1) -> dict:
    """One ``ranks``-process job at ZeRO stage ``zero`` (0 ranks: one process without the launch
    environment); returns rank 0's summary record."""
    metrics = out / f"zero{zero}-{ranks}.jsonl"
    argv = [
        sys.executable,
        "-m",
        "distlaunch.engine",
        "--metrics-file",
        str(metrics),
        "--set",
        f"model.preset={preset}",
        "--set",
        f"train.steps={steps}",
        "--set",
        "train.seq_len=64",
        "--set",
        f"train.global_batch_size={max(ranks, 1)}",
        "--set",
        f"parallel.zero={zero}",
    ]
    port = free_port()
    procs = []
    for rank in range(max(ranks, 1)):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "DISTLAUNCH_PARALLEL")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
        if ranks:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(ranks),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        procs.append(
            subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        )
    errors = [p.communicate()[1] for p in procs]
    for rank, (proc, err) in enumerate(zip(procs, errors, strict=False)):
        if proc.returncode != 0:
            raise SystemExit(f"zero={zero}: rank {rank} exited {proc.returncode}:\n{err[-2000:]}")
    return json.loads(metrics.read_text().splitlines()[-1])


def import_rss_bytes() -> int:
    """The peak RSS of a process that only imports torch and the engine: every process pays it."""
    code = "import distlaunch.engine.trainer as t; print(t.peak_rss_bytes())"  # VmHWM: this process's own
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return int(out.stdout)


def peaks(preset: str, ranks: int) -> None:
    """Each ZeRO-3 rank's init and run peak RSS against one process's (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        sharded = run_stage(3, preset, ranks, Path(tmp), steps=2)
        single = run_stage(0, preset, 0, Path(tmp), steps=2)
    base = import_rss_bytes()
    one_init, one_run = single["init_peak_per_rank"][0]["rss_bytes"], single["peak_per_rank"][0]["rss_bytes"]
    mib = 2**20
    print(f"preset={preset}, dp={ranks} ZeRO-3 (gloo, CPU, fp32) against one process; peak RSS in MiB")
    print(f"{'':<14}{'init peak':>10}{'ratio':>8}{'run peak':>10}{'ratio':>8}")
    print(f"{'one process':<14}{one_init / mib:10.0f}{1:8.2f}{one_run / mib:10.0f}{1:8.2f}")
    worst = 0.0
    for rank, (init, run) in enumerate(zip(sharded["init_peak_per_rank"], sharded["peak_per_rank"], strict=True)):
        worst = max(worst, run["rss_bytes"] / one_run)
        print(
            f"{f'rank {rank}':<14}{init['rss_bytes'] / mib:10.0f}{init['rss_bytes'] / one_init:8.2f}"
            f"{run['rss_bytes'] / mib:10.0f}{run['rss_bytes'] / one_run:8.2f}"
        )
    largest = max(r["rss_bytes"] for r in sharded["peak_per_rank"])
    print(
        f"importing torch and the engine: {base / mib:.0f} MiB in every process; without it the largest rank's run "
        f"peak is {(largest - base) / (one_run - base):.2f}x one process's. Goal: run peak <= 0.45x: "
        f"{'ok' if worst <= 0.45 else 'MISSED'} ({worst:.2f})"
    )
    if worst > 0.45:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default=None, help="default: small (125m with --peaks)")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--peaks", action="store_true", help="peak RSS per ZeRO-3 rank against one process")
    args = parser.parse_args()
    if args.peaks:
        peaks(args.preset or "125m", args.ranks)
        return
    args.preset = args.preset or "small"
    n = args.ranks
    print(
        f"preset={args.preset}, dp={n} ranks (gloo, CPU), fp32 params/grads, fp32 AdamW; MiB per rank (max over ranks)"
    )
    print(f"{'stage':<7}{'params':>9}{'grads':>9}{'adam':>9}{'total':>10}{'formula':>10}{'ratio':>8}   formula terms")
    terms = ["4Ψ+4Ψ+8Ψ", "4Ψ+4Ψ+8Ψ/N", "4Ψ+4Ψ/N+8Ψ/N", "4Ψ/N+4Ψ/N+8Ψ/N"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for zero in range(4):
            summary = run_stage(zero, args.preset, n, Path(tmp))
            psi = summary["n_params"]
            per_rank = summary["mem_bytes_per_rank"]
            peak = max(per_rank, key=lambda r: r["total"])
            expect = formula(zero, psi, n)
            ratio = peak["total"] / sum(expect.values())
            worst = max(worst, abs(ratio - 1))
            mib = [peak["params"] / 2**20, peak["grads"] / 2**20, peak["optimizer"] / 2**20, peak["total"] / 2**20]
            print(
                f"zero={zero:<2}{mib[0]:9.1f}{mib[1]:9.1f}{mib[2]:9.1f}{mib[3]:10.1f}"
                f"{sum(expect.values()) / 2**20:10.1f}{ratio:8.4f}   {terms[zero]}"
            )
    print(f"Ψ = {psi:,} parameters, N = {n}; largest deviation from the formula: {worst:.2%} (goal: within 5%)")
    if worst > 0.05:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
