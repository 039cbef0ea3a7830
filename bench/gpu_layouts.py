"""The engine's multi-rank layouts on one GPU, against one rank on the same GPU.

    python bench/gpu_layouts.py              # on a machine with one CUDA GPU
    python bench/gpu_layouts.py --cpu        # the same check on CPU processes

NCCL refuses two ranks on one GPU ("invalid usage": each rank of a communicator needs a GPU of its
own), so the two ranks here talk over gloo with CUDA tensors: gloo copies them through the host
and takes fp32 all-reduce, all-gather and reduce-scatter on CUDA tensors, but not send/recv (it
fails with "Bad address") nor bf16. That covers dp with every ZeRO stage and tp in fp32, on the
GPU's kernels, streams and allocator, eager and under torch.compile (tp=2, ZeRO-3); pp, which sends
activations between stages, is run too and reported as failing there. Each layout trains the tiny GPT for 6 steps (the same seed and
batch; fp32, and fp16 with ZeRO-3, whose loss scaling and 16-bit all-gathers no GPU has run otherwise);
the script prints each layout's largest loss difference from one rank in the same precision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
BASE = [
    "model.preset='tiny'",
    f"train.steps={STEPS}",
    "train.global_batch_size=8",
    "train.seq_len=64",
    "train.seed=11",
    "train.compile=false",
    "train.warmup_steps=1",
    "train.bucket_mb=0.25",  # several buckets, each launched from a backward hook
    "train.eval_every=0",
]
LAYOUTS = {
    "dp2 zero0": ["parallel.zero=0"],
    "dp2 zero1": ["parallel.zero=1"],
    "dp2 zero2": ["parallel.zero=2"],
    "dp2 zero3": ["parallel.zero=3"],
    "tp2": ["parallel.tp=2"],
    "tp2 compiled": ["parallel.tp=2", "train.compile=true"],
    "dp2 zero3 compiled": ["parallel.zero=3", "train.compile=true"],
    "dp2 zero3 fp16": ["parallel.zero=3", "train.precision='fp16'"],
    "pp2": ["parallel.pp=2"],  # last: a rank that fails here leaves no later layout waiting
}
# fp32: the CPU parity tests hold 1e-5 over 20 steps; fp16 (ZeRO-3 gathers 16-bit weights where one rank
# casts fp32 ones under autocast): 1.5e-4 on CPU processes
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3}


def precision_of(overrides: list[str]) -> str:
    """The ``train.precision`` of a layout: the one-rank run it is compared with trains in the same one."""
    from distlaunch.training.config import load_config

    return load_config(None, BASE + overrides).train.precision


PRECISIONS = sorted({precision_of(extra) for extra in LAYOUTS.values()})


def train_layouts(device_type: str) -> None:
    """This process's part: every layout of its world size, one JSON line each on rank 0."""
    import torch
    import torch.distributed as dist

    from distlaunch.engine.parallel.mesh import build_mesh
    from distlaunch.engine.trainer import Engine
    from distlaunch.training.config import load_config
    from distlaunch.training.dims import resolve_parallel_dims
    from distlaunch.training.presets import model_config

    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    singles = {f"single {p}": [f"train.precision='{p}'"] for p in PRECISIONS}
    for name, extra in (singles if world == 1 else LAYOUTS).items():
        try:
            cfg = load_config(None, BASE + extra)
            dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset), world)
            engine = Engine(cfg, dims, build_mesh(dims, device), device)
            line = {"layout": name, "losses": [float(engine.train_step(s).loss) for s in range(1, STEPS + 1)]}
        except Exception as err:  # reported; this rank stops
            line = {"layout": name, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
        if dist.get_rank() == 0:
            print(json.dumps(line), flush=True)
        if "error" in line:
            os._exit(1)  # the other rank may wait in a collective for good; the parent ends it
        dist.barrier()
    dist.destroy_process_group()


def run_part(device_type: str, world: int) -> dict[str, dict]:
    """One rank, or two under torchrun; the JSON lines they printed, by layout."""
    me = [__file__, "--part", device_type]
    argv = (
        [sys.executable, *me]
        if world == 1
        else [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *me]
    )
    try:
        proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=600)
        out = proc.stdout
    except subprocess.TimeoutExpired as err:
        out = err.stdout or ""
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {line["layout"]: line for line in lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="CPU processes instead of the GPU")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        train_layouts(args.part)
        return
    device_type = "cpu" if args.cpu else "cuda"
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: no CUDA GPU is visible (torch.cuda.is_available() is False); use --cpu, or a GPU machine")
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, gloo with CUDA tensors")
    singles = run_part(device_type, 1)
    layouts = run_part(device_type, 2)
    for name, extra in LAYOUTS.items():
        precision = precision_of(extra)
        single = singles[f"single {precision}"]["losses"]
        got = layouts.get(name)
        if got is None:
            print(f"{name:>18}: did not run (an earlier layout stopped the job)")
        elif "error" in got:
            print(f"{name:>18}: fails: {got['error']}")
        else:
            diff = max(abs(a - b) for a, b in zip(got["losses"], single, strict=True))
            verdict = "matches" if diff <= TOLERANCE[precision] else "DIFFERS"
            print(f"{name:>18}: {verdict} one rank over {STEPS} steps, largest loss difference {diff:.1e}")


if __name__ == "__main__":
    main()
