"""One rank of a test job: runs several layouts in one process group, saves what each produced.

Started by ``tests/engine/harness.py`` with the torchrun environment (or none, for the
single-process reference). For each layout it trains ``train.steps`` steps, keeping the loss
and gradient norm of every step the whole gradients of step 1 (before its optimizer step) and its mesh groups,
and writes ``<out>/<layout>.rank<r>.pt``.

    python tests/engine/_worker.py OUT_DIR SPEC_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distlaunch.engine.config import load_config
from distlaunch.engine.model import PRESETS
from distlaunch.engine.parallel.dims import resolve_parallel_dims
from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, read_env
from distlaunch.engine.trainer import Engine


def run_layout(overrides: list[str], world_size: int) -> dict:
    """Train one layout; returns losses, grad norms, step-1 gradients and state bytes."""
    cfg = load_config(None, overrides)
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    mesh = build_mesh(dims, torch.device("cpu"))
    engine = Engine(cfg, dims, mesh, torch.device("cpu"))
    groups = {dim: dist.get_process_group_ranks(mesh[dim].get_group()) for dim in ("pp", "dp", "tp")}
    losses, norms, grads = [], [], {}
    for step in range(1, cfg.train.steps + 1):
        local_loss = engine.forward_backward(step)
        loss, norm = engine.reduce_loss_and_norm(local_loss)
        if step == 1:
            grads = engine.full_gradients()
        engine.optimizer_step()
        losses.append(loss)
        norms.append(norm)
    return {
        "losses": losses,
        "grad_norms": norms,
        "grads": grads,
        "mem": engine.state_bytes(),
        "groups": groups,
        "dims": dims.describe(),
    }


def main(out_dir: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    for name, overrides in spec["layouts"].items():
        result = run_layout(spec["base"] + overrides, env.world_size)
        torch.save(result, Path(out_dir) / f"{name}.rank{env.rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
