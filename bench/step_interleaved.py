"""One torchrun job whose ranks alternate a ``distlaunch train`` engine step and a reference step.

    torchrun --nproc-per-node 2 bench/step_interleaved.py --preset tiny --steps 40 \\
        --global-batch-size 16 --seq-len 128 --out steps.json
    torchrun --nproc-per-node 5 bench/step_interleaved.py --zero 1 --against zero0 --steps 40 \\
        --global-batch-size 40 --seq-len 128 --out steps.json [--phases]

Two jobs run one after the other meet different machine loads (a shared VM drifts by ±10% and
more between runs); here every engine step has a reference step next to it, under the same
load, in the same processes. The engine is built as ``distlaunch train`` builds it
(``engine_overrides``: dp = the world size, ``--zero``, the reference's settings); the reference
is ddp_reference.py's loop (``--against ddp``) or a second engine with ZeRO-0 (``--against
zero0``), and the pair's order alternates every step. Rank 0 writes ``{"engine_s": [...],
"reference_s": [...], "engine_cpu_s": [...], "reference_cpu_s": [...]}``: the step times in
seconds, and the CPU seconds each step took on all ranks together.

``--phases`` also times where an engine's step goes (``PHASES``), on every rank, and rank 0 prints
the median wall milliseconds of each phase over steps 3..N for the engine and, with ``--against
zero0``, the ZeRO-0 engine; the JSON gets them as ``engine_phases_ms`` and ``reference_phases_ms``.
"""

from __future__ import annotations

import collections
import json
import statistics
import time

import torch.distributed as dist
from ddp_reference import Reference, arguments, init
from engine_throughput import engine_overrides

from distlaunch.engine.__main__ import end_process
from distlaunch.engine.parallel.mesh import build_mesh
from distlaunch.engine.trainer import Engine, read_results
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.presets import model_config


def build_engine(args, zero: int, device) -> Engine:
    cfg = load_config(None, engine_overrides(args, zero))
    dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), dist.get_world_size())
    return Engine(cfg, dims, build_mesh(dims, device), device)


# an engine step's phases, in order (``Engine.train_step``), each an (owner, method) pair whose calls are
# timed; the optimizer step includes ZeRO-1/2's parameter all-gather, which ZeRO-0 does not have
PHASES = {
    "forward, backward, gradient collective": ("engine", "forward_backward"),
    "loss and gradient norm": ("engine", "reduce_loss_and_norm_tensors"),
    "optimizer step": ("engine", "optimizer_step"),
    "  of which the parameter all-gather": ("data_parallel", "gather_parameters"),
}


def time_phases(engine: Engine) -> dict[str, list[float]]:
    """Wrap ``engine``'s phases (``PHASES``) in wall-clock timers; returns the seconds each call took,
    by phase, filled as the engine steps."""
    spent: dict[str, list[float]] = collections.defaultdict(list)
    for phase, (owner, name) in PHASES.items():
        target = engine if owner == "engine" else engine.data_parallel
        method = getattr(target, name, None)
        if method is None:  # ZeRO-0: no all-gather
            continue

        def timed(*args, _method=method, _phase=phase, **kwargs):
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_phase].append(time.perf_counter() - start)

        setattr(target, name, timed)
    return spent


WARM_UP = 2  # steps left out of the phase medians: the first ones build buffers and warm up


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds[WARM_UP:]) * 1000


def phase_medians(spent: dict[str, list[float]]) -> dict[str, float]:
    """Median milliseconds of each phase over steps 3..N."""
    return {phase: median_ms(times) for phase, times in spent.items() if len(times) > WARM_UP}


def stepper(engine: Engine):
    def step(n: int) -> None:
        read_results([engine.train_step(n)])  # the loss on the host, as the reference reads it

    return step


def main() -> None:
    parser = arguments()
    parser.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--against", default="ddp", choices=["ddp", "zero0"])
    parser.add_argument("--phases", action="store_true", help="also time each phase of an engine step")
    args = parser.parse_args()
    device = init()
    args.dp = dist.get_world_size()
    engines = {"engine": build_engine(args, args.zero, device)}
    if args.against == "zero0":
        engines["reference"] = build_engine(args, 0, device)
    spent = {key: time_phases(engine) for key, engine in engines.items()} if args.phases else {}
    engine_step = stepper(engines["engine"])
    reference_step = stepper(engines["reference"]) if "reference" in engines else Reference(args, device).step

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
        for key, phases in spent.items():
            times[f"{key}_phases_ms"] = phase_medians(phases)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(times, f)
        if spent:
            print_phases(times, list(spent))
    dist.destroy_process_group()
    # as the engine's ranks leave: at interpreter shutdown a gloo thread of one of the two engines' groups can
    # abort the process ("terminate called without an active exception"), and torchrun then fails the run
    end_process(0)


def print_phases(times: dict, keys: list[str]) -> None:
    """Rank 0's phase medians, one column per engine, and the whole step's median beside them."""
    print(f"{'rank 0, median ms (steps 3..N)':40}" + "".join(f"{key:>12}" for key in keys))
    for phase in PHASES:
        cells = [times[f"{key}_phases_ms"].get(phase) for key in keys]
        print(f"{phase:40}" + "".join(f"{'-' if c is None else f'{c:.2f}':>12}" for c in cells))
    steps = [median_ms(times[f"{key}_s"]) for key in keys]
    print(f"{'whole step':40}" + "".join(f"{ms:>12.2f}" for ms in steps))


if __name__ == "__main__":
    main()
