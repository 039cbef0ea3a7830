"""ZeRO stages 0-3 on 4 ranks: measured state bytes per rank next to the ZeRO formula.

    python bench/zero_memory.py [--preset small] [--ranks 4]

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


def run_stage(zero: int, preset: str, ranks: int, out: Path) -> dict:
    """One ``ranks``-process job at ZeRO stage ``zero``; returns rank 0's summary record."""
    metrics = out / f"zero{zero}.jsonl"
    argv = [
        sys.executable,
        "-m",
        "distlaunch.engine",
        "--metrics-file",
        str(metrics),
        "--set",
        f"model.preset={preset}",
        "--set",
        "train.steps=1",
        "--set",
        "train.seq_len=64",
        "--set",
        f"train.global_batch_size={ranks}",
        "--set",
        f"parallel.zero={zero}",
    ]
    port = free_port()
    procs = []
    for rank in range(ranks):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
            PYTHONWARNINGS="ignore",
        )
        procs.append(
            subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        )
    errors = [p.communicate()[1] for p in procs]
    for rank, (proc, err) in enumerate(zip(procs, errors, strict=False)):
        if proc.returncode != 0:
            raise SystemExit(f"zero={zero}: rank {rank} exited {proc.returncode}:\n{err[-2000:]}")
    return json.loads(metrics.read_text().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
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
