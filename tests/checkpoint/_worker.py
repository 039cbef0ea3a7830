"""One rank of a resharding test job: several train/resume phases in one process group.

Started by ``tests/engine/harness.spawn`` with the torchrun environment. Each phase builds the
engine for its layout and runs the real training loop (``distlaunch.engine.loop.train``) with
its checkpoint hooks: resume (``checkpoint.resume``), saves, the lot. Rank 0 writes
``<out>/<phase>.json``: the loss of every step it ran. For the phases listed under ``masters``
every rank also writes what its optimizer updates at the end, ``<out>/<phase>.masters.rank<r>.pt``:
name -> (start of its slice in the flattened parameter, fp32 values).

    python tests/checkpoint/_worker.py OUT_DIR SPEC_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distlaunch.engine.__main__ import end_process
from distlaunch.engine.checkpoint.session import Checkpointing
from distlaunch.engine.checkpoint.shards import param_entries
from distlaunch.engine.loop import train
from distlaunch.engine.metrics import MetricsWriter
from distlaunch.engine.model import PRESETS
from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, read_env
from distlaunch.engine.trainer import Engine
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims


def run_phase(overrides: list[str], rank: int, world_size: int, metrics: Path, masters: Path | None) -> None:
    """Build the engine for one layout and train it through the real loop."""
    cfg = load_config(None, overrides)
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    engine = Engine(cfg, dims, build_mesh(dims, torch.device("cpu")), torch.device("cpu"))
    checkpoints = Checkpointing(engine, rank)
    first_step = checkpoints.start()
    writer = MetricsWriter(metrics, enabled=rank == 0)
    try:
        train(engine, writer, rank, first_step, checkpoints)
    finally:
        writer.close()
    if masters is not None:
        entries = param_entries(engine.data_parallel)
        state = {e.name: (e.shard.start if e.shard else 0, e.opt_param.detach().clone()) for e in entries}
        torch.save(state, masters)


def main(out_dir: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    for name, overrides in spec["phases"].items():
        metrics = Path(out_dir) / f"{name}.jsonl"
        masters = Path(out_dir) / f"{name}.masters.rank{env.rank}.pt" if name in spec.get("masters", ()) else None
        run_phase(spec["base"] + overrides, env.rank, env.world_size, metrics, masters)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_process(0)  # as an engine rank ends: no collective in flight can abort the exit
