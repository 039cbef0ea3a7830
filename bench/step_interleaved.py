"""One torchrun job whose ranks alternate a ``distlaunch train`` engine step and a DDP step.

    torchrun --nproc-per-node 2 bench/step_interleaved.py --preset tiny --steps 40 \\
        --global-batch-size 16 --seq-len 128 --out steps.json

Two jobs run one after the other meet different machine loads (a shared VM drifts by ±10% and
more between runs); here every engine step has a reference step next to it, under the same
load, in the same processes. The engine is built as ``distlaunch train`` builds it
(``engine_overrides``: dp=2, ZeRO-0, the reference's settings), the reference is
ddp_reference.py's loop, and the pair's order alternates every step. Rank 0 writes
``{"engine_s": [...], "reference_s": [...]}``, the step times in seconds.
"""

from __future__ import annotations

import json
import time

import torch.distributed as dist
from ddp_reference import Reference, init, parse_args
from engine_throughput import engine_overrides

from distlaunch.engine.config import load_config
from distlaunch.engine.parallel.dims import resolve_parallel_dims
from distlaunch.engine.parallel.mesh import build_mesh
from distlaunch.engine.presets import model_config
from distlaunch.engine.trainer import Engine, read_results


def main() -> None:
    args = parse_args()
    device = init()
    cfg = load_config(None, engine_overrides(args))
    dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), dist.get_world_size())
    engine = Engine(cfg, dims, build_mesh(dims, device), device)
    reference = Reference(args, device)

    def engine_step(step: int) -> None:
        read_results([engine.train_step(step)])  # the loss on the host, as the reference reads it

    times: dict[str, list[float]] = {"engine_s": [], "reference_s": []}
    for step in range(1, args.steps + 1):
        pair = [("engine_s", engine_step), ("reference_s", reference.step)]
        for key, run in pair if step % 2 else reversed(pair):
            start = time.perf_counter()
            run(step)
            times[key].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
