"""One rank of the build-memory test: builds the engine for a layout under ``PeakLiveBytes``.

Writes ``<out>/<layout>.rank<r>.json``: the peak bytes allocated while the engine was built, the
parameter bytes the rank keeps, the bytes of one whole block and of the whole stage.

    python tests/engine/_build_peak.py OUT_DIR PRESET LAYOUT...   (a layout: overrides joined by '+')
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distlaunch.engine.__main__ import end_process
from distlaunch.engine.model import PRESETS
from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, read_env
from distlaunch.engine.trainer import Engine
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from tests.live_memory import PeakLiveBytes, count_allocations


def first_block_params(engine: Engine):
    """The parameters of the first block this rank holds."""
    return next(iter(engine.chunks[0].blocks.values())).parameters()


def main(out_dir: str, preset: str, layouts: list[str]) -> None:
    count_allocations()
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    for layout in layouts:
        cfg = load_config(None, [f"model.preset='{preset}'", "train.seq_len=64", *layout.split("+")])
        dims = resolve_parallel_dims(cfg, PRESETS[preset], env.world_size)
        mesh = build_mesh(dims, torch.device("cpu"))
        with PeakLiveBytes() as live:
            engine = Engine(cfg, dims, mesh, torch.device("cpu"))
        params = [p for chunk in engine.chunks for p in chunk.parameters()]
        result = {
            "peak": live.peak - live.start,
            "kept_params": engine.state_bytes()["params"],
            # a whole transformer block (numel of a DTensor is the whole tensor's)
            "layer": sum(p.numel() * p.element_size() for p in first_block_params(engine)),
            "stage_params": sum(p.numel() * p.element_size() for p in params),
        }
        (Path(out_dir) / f"{layout}.rank{env.rank}.json").write_text(json.dumps(result))
        del engine
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
    end_process(0)  # as an engine rank ends: no collective in flight can abort the exit
