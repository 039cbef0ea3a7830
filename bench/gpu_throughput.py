"""bf16 tokens/s, MFU and peak memory of ``distlaunch train`` on one GPU, against a reference loop.

    python bench/gpu_throughput.py                          # 125m and 1.3b, bf16, one GPU, every figure printed
    python bench/gpu_throughput.py --presets 1.3b --rounds 3  # one preset, three rounds

For each preset, in the same run and on the same GPU, ``--rounds`` rounds (3) of the two loops back to back, in
alternating order (the figures printed are the median round's):

- the engine: ``distlaunch train -n 1`` (the NCCL path with one rank), bf16, one micro-batch per
  step; its summary gives the median tokens/s over steps 2..N and the MFU, its step records the
  CUDA allocator's peak, and ``--dry-run --json`` of the same job the planner's peak beside it;
- the reference: the nanoGPT / torchtitan recipe in plain PyTorch on the same GPT shapes, the same
  batch and sequence length: ``torch.compile`` of the whole model, ``torch.optim.AdamW(fused=True)``,
  bf16 autocast, fp32 weights, random tokens; timed per step with CUDA events, median over the
  steps after warm-up (compilation excluded).

Then, for each preset, it counts the host syncs inside engine steps: the same engine, built in one
process, runs a few steps, then three more under ``torch.cuda.set_sync_debug_mode("error")``; the
first synchronising call, if any, is named with its line (goal: none).

It prints one line per (preset, loop) and the ratio engine / reference, the sync audit, then one
JSON object with every figure. Goals: MFU >= 50% for 1.3b, engine >= 0.95 x reference. MFU counts
6 FLOPs per multiplying weight and token plus 12*L*d*T for attention (embedding lookups excluded,
as torchtitan counts; ``engine/metrics.py``) against the GPU's dense bf16 peak (989 TFLOP/s for
H100 SXM and H200).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (preset, seq_len, batch): one micro-batch per step, sized for one 80 GB H100 without activation checkpointing
DEFAULT_RUNS = [("125m", 1024, 32), ("1.3b", 2048, 8)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="125m,1.3b", help="comma-separated presets of the default runs")
    parser.add_argument("--steps", type=int, default=30, help="steps per loop (the first ones are warm-up)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds per preset: engine and reference back to back, in alternating order",
    )
    parser.add_argument("--reference", nargs=3, metavar=("PRESET", "SEQ_LEN", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--sync-audit", nargs=3, metavar=("PRESET", "SEQ_LEN", "BATCH"), help=argparse.SUPPRESS)
    return parser.parse_args()


def reference_loop(preset: str, seq_len: int, batch: int, steps: int) -> dict:
    """The plain-PyTorch reference on this process's GPU; its figures."""
    import torch
    import torch.nn.functional as F

    from distlaunch.engine.metrics import flops_per_token, peak_flops
    from distlaunch.engine.model import GPT, PRESETS, init_weights

    device = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = PRESETS[preset]
    model = GPT(cfg).to(device)
    init_weights(model, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model)
    gen = torch.Generator(device=device).manual_seed(0)
    times = []
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device, generator=gen)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(x[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    tokens_per_s = batch * seq_len / statistics.median(times[max(1, steps // 3) :])
    peak = peak_flops(device, "bf16")
    return {
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token(cfg, seq_len) / peak if peak else None,
        "peak_bytes": torch.cuda.max_memory_allocated(device),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
    }


def run_reference(preset: str, seq_len: int, batch: int, steps: int) -> dict:
    """The reference in its own process (its own allocator peak and compile cache)."""
    argv = [sys.executable, __file__, "--steps", str(steps), "--reference", preset, str(seq_len), str(batch)]
    out = subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def engine_sets(preset: str, seq_len: int, batch: int, steps: int) -> list[str]:
    """The engine's job: bf16, one rank, one micro-batch per step. Read every 10 steps: the first
    step (compilation) is read on its own, and each later record is the mean of its interval."""
    return [
        f"model.preset='{preset}'",
        f"train.steps={steps}",
        f"train.seq_len={seq_len}",
        f"train.global_batch_size={batch}",
        f"train.micro_batch_size={batch}",
        "train.precision='bf16'",
        "train.eval_every=0",
        "train.log_every=10",
        "parallel.dp=1",
        "parallel.tp=1",
        "parallel.pp=1",
        "parallel.zero=0",
    ]


def run_engine(preset: str, seq_len: int, batch: int, steps: int, out: Path) -> dict:
    """One ``distlaunch train -n 1`` job in bf16; its summary plus the allocator peak."""
    metrics = out / f"engine-{preset}.jsonl"
    metrics.unlink(missing_ok=True)
    sets = engine_sets(preset, seq_len, batch, steps)
    argv = [sys.executable, "-m", "distlaunch", "train", "-n", "1"]
    for assignment in sets:
        argv += ["--set", assignment]
    # the planner's peak for the same job (docs/train.md), beside the one the allocator measures
    plan = subprocess.run([*argv, "--dry-run", "--json"], check=True, cwd=REPO, stdout=subprocess.PIPE, text=True)
    planned = json.loads(plan.stdout)["memory"]["ranks"][0]
    start = time.perf_counter()
    subprocess.run([*argv, "--metrics-file", str(metrics)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps_seen = [r for r in records if "step" in r and "event" not in r]
    summary = records[-1]
    return {
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary["mfu"],
        "peak_bytes": max((r.get("device_peak_bytes") or 0) for r in steps_seen) if steps_seen else None,
        "planned_peak_bytes": planned["peak"],
        "device": records[0].get("device"),
        "wall_s": time.perf_counter() - start,
    }


def sync_audit(preset: str, seq_len: int, batch: int) -> dict:
    """Host syncs inside engine steps on this process's GPU: 3 steps to warm up (compilation
    syncs), then 3 under ``set_sync_debug_mode("error")``, which raises at the first
    synchronising call; returns the count (0 or 1) and where the first one happened."""
    import traceback

    import torch

    from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, pick_device, read_env
    from distlaunch.engine.trainer import Engine
    from distlaunch.training.config import load_config
    from distlaunch.training.dims import resolve_parallel_dims
    from distlaunch.training.presets import model_config

    cfg = load_config(None, engine_sets(preset, seq_len, batch, steps=6))
    env = read_env()
    device = pick_device(env.local_rank, "nccl")
    init_process_group(env, device)
    dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), env.world_size)
    engine = Engine(cfg, dims, build_mesh(dims, device), device)
    for step in (1, 2, 3):
        engine.train_step(step)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in (4, 5, 6):
            engine.train_step(step)
    except RuntimeError as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if "distlaunch" in f.filename]
        where = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else str(err)
        return {"host_syncs": 1, "first_sync": where}
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.distributed.destroy_process_group()
    return {"host_syncs": 0, "first_sync": None}


def run_sync_audit(preset: str, seq_len: int, batch: int) -> dict:
    """The sync audit in its own process (its own process group and allocator)."""
    argv = [sys.executable, __file__, "--sync-audit", preset, str(seq_len), str(batch)]
    out = subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def gib(n: int | None) -> str:
    return f"{n / 2**30:6.1f} GiB" if n else "     n/a"


def pct(x: float | None) -> str:
    return f"{x:6.1%}" if x is not None else "   n/a"


def planned_ratio(engine: dict) -> str:
    """The planner's peak over the allocator's (docs/train.md holds the planner within 10% on CPU)."""
    if not engine["peak_bytes"]:
        return "n/a"
    return f"{engine['planned_peak_bytes'] / engine['peak_bytes']:.3f}"


def main() -> None:
    args = parse_args()
    if args.reference:
        preset, seq_len, batch = args.reference
        print(json.dumps(reference_loop(preset, int(seq_len), int(batch), args.steps)))
        return
    if args.sync_audit:
        preset, seq_len, batch = args.sync_audit
        print(json.dumps(sync_audit(preset, int(seq_len), int(batch))))
        return
    import torch

    if not torch.cuda.is_available():
        # the engine and the reference would both fall back to the CPU and run for hours
        sys.exit("error: no CUDA GPU is visible (torch.cuda.is_available() is False); run this on a GPU machine")
    wanted = args.presets.split(",")
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset, seq_len, batch in [r for r in DEFAULT_RUNS if r[0] in wanted]:
            head = f"{preset:>5} bf16, batch {batch} x {seq_len}"
            rounds = []
            for i in range(args.rounds):
                # alternating order: whichever runs second finds the GPU warm (clocks, caches) the first found cold
                if i % 2 == 0:
                    engine = run_engine(preset, seq_len, batch, args.steps, Path(tmp))
                    reference = run_reference(preset, seq_len, batch, args.steps)
                else:
                    reference = run_reference(preset, seq_len, batch, args.steps)
                    engine = run_engine(preset, seq_len, batch, args.steps, Path(tmp))
                rounds.append((engine["tokens_per_s"] / reference["tokens_per_s"], engine, reference))
                print(f"{head}, round {i + 1}: ratio engine / reference {rounds[-1][0]:.3f}", flush=True)
            # the figures below are the median round's (by its ratio)
            ratio, engine, reference = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
            syncs = run_sync_audit(preset, seq_len, batch)
            print(
                f"{head}, distlaunch train : {engine['tokens_per_s']:10.0f} tok/s  MFU {pct(engine['mfu'])}  peak {gib(engine['peak_bytes'])}"
                f"  (planned {gib(engine['planned_peak_bytes'])}: {planned_ratio(engine)} x measured)"
            )
            print(
                f"{head}, reference loop   : {reference['tokens_per_s']:10.0f} tok/s  MFU {pct(reference['mfu'])}  peak {gib(reference['peak_bytes'])}"
            )
            print(f"{head}, ratio engine / reference {ratio:.3f} (the median round of {len(rounds)}; goal >= 0.95)")
            where = f", the first at {syncs['first_sync']}" if syncs["first_sync"] else ""
            print(f"{head}, host syncs in engine steps 4-6: {syncs['host_syncs']}{where} (goal: 0)", flush=True)
            figures.append(
                {
                    "preset": preset,
                    "seq_len": seq_len,
                    "batch": batch,
                    "engine": engine,
                    "reference": reference,
                    "ratio": ratio,
                    "round_ratios": [r[0] for r in rounds],
                    "sync_audit": syncs,
                }
            )
    gpu = figures[0]["reference"]["gpu"] if figures else None
    print(json.dumps({"gpu": gpu, "steps": args.steps, "runs": figures}))


if __name__ == "__main__":
    main()
