"""One torchrun job whose ranks alternate a ``distlaunch train`` engine step and a reference step.

    torchrun --nproc-per-node 2 bench/step_interleaved.py --preset tiny --steps 40 \\
        --global-batch-size 16 --seq-len 128 --out steps.json
    torchrun --nproc-per-node 5 bench/step_interleaved.py --zero 1 --against zero0 --steps 40 \\
        --global-batch-size 40 --seq-len 128 --out steps.json

Two jobs run one after the other meet different machine loads (a shared VM drifts by ±10% and
more between runs); here every engine step has a reference step next to it, under the same
load, in the same processes. The engine is built as ``distlaunch train`` builds it
(``engine_overrides``: dp = the world size, ``--zero``, the reference's settings); the reference
is ddp_reference.py's loop (``--against ddp``) or a second engine with ZeRO-0 (``--against
zero0``), and the pair's order alternates every step. Rank 0 writes ``{"engine_s": [...],
"reference_s": [...], "engine_cpu_s": [...], "reference_cpu_s": [...]}``: the step times in
seconds, and the CPU seconds each step took on all ranks together.
"""

from __future__ import annotations

import json
import time

import torch.distributed as dist
from ddp_reference import Reference, arguments, init
from engine_throughput import engine_overrides

from distlaunch.engine.__main__ import end_process
from distlaunch.engine.config import load_config
from distlaunch.engine.parallel.dims import resolve_parallel_dims
from distlaunch.engine.parallel.mesh import build_mesh
from distlaunch.engine.presets import model_config
from distlaunch.engine.trainer import Engine, read_results


def build_engine(args, zero: int, device) -> Engine:
    cfg = load_config(None, engine_overrides(args, zero))
    dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), dist.get_world_size())
    return Engine(cfg, dims, build_mesh(dims, device), device)


def stepper(engine: Engine):
    def step(n: int) -> None:
        read_results([engine.train_step(n)])  # the loss on the host, as the reference reads it

    return step


def main() -> None:
    parser = arguments()
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--against", default="ddp", choices=["ddp", "zero0"])
    args = parser.parse_args()
    device = init()
    args.dp = dist.get_world_size()
    engine_step = stepper(build_engine(args, args.zero, device))
    reference_step = stepper(build_engine(args, 0, device)) if args.against == "zero0" else Reference(args, device).step

    times: dict[str, list[float]] = {"engine_s": [], "reference_s": []}
    cpu: dict[str, list[float]] = {"engine_s": [], "reference_s": []}
    for step in range(1, args.steps + 1):
        pair = [("engine_s", engine_step), ("reference_s", reference_step)]
        for key, run in pair if step % 2 else reversed(pair):
            start, used = time.perf_counter(), time.process_time()
            run(step)
            times[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - used)  # every thread of the rank: gloo's too
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, cpu)
    if dist.get_rank() == 0:
        # the CPU seconds a step takes on all ranks together: what bounds throughput once the ranks
        # outnumber the cores, and steadier than wall time on a shared machine
        for key in cpu:
            times[f"{key.removesuffix('_s')}_cpu_s"] = [
                sum(per_step) for per_step in zip(*(r[key] for r in ranks), strict=True)
            ]
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(times, f)
    dist.destroy_process_group()
    # as the engine's ranks leave: at interpreter shutdown a gloo thread of one of the two engines' groups can
    # abort the process ("terminate called without an active exception"), and torchrun then fails the run
    end_process(0)


if __name__ == "__main__":
    main()
