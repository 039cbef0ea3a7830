"""One rank of a test job: runs several layouts in one process group, saves what each produced.

Started by ``tests/engine/harness.py`` with the torchrun environment (or none, for the
single-process reference). For each layout it trains ``train.steps`` steps, keeping the loss
and gradient norm of every step the whole gradients of step 1 (before its optimizer step) and its mesh groups,
and writes ``<out>/<layout>.rank<r>.pt``.

    python tests/engine/_worker.py OUT_DIR SPEC_JSON
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops
from torch.utils._python_dispatch import TorchDispatchMode

from distlaunch.contract.layout import spelling
from distlaunch.engine.__main__ import end_process
from distlaunch.engine.model import PRESETS
from distlaunch.engine.parallel.compile import is_compiled
from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, read_env
from distlaunch.engine.trainer import Engine
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims


def _sent(func, args: tuple) -> list[torch.Tensor]:
    """What this rank hands to a collective: an all-reduce's tensors (in place), else the input
    of an (output, input) collective (all-gather: this rank's shard; reduce-scatter and all-to-all:
    the whole send buffer)."""
    first = args[0]
    if isinstance(first, (list, tuple)):  # allreduce_, broadcast_, ...: the tensors themselves
        return [t for t in first if isinstance(t, torch.Tensor)]
    second = args[1] if len(args) > 1 else None
    return [second] if isinstance(second, torch.Tensor) else [first]


class CollectiveCounter(TorchDispatchMode):
    """Counts every c10d collective dispatched while active (the ops CommDebugMode counts,
    without its module tracker, which does not follow modules called several times a step), and
    the bytes handed to them: ``bytes`` maps "op dtype" (e.g. "allreduce_ torch.bfloat16") to bytes."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in c10d_collective_ops:
            self.count += 1
            for t in _sent(func, args):
                key = f"{func.overloadpacket.__name__} {t.dtype}"
                self.bytes[key] = self.bytes.get(key, 0) + t.numel() * t.element_size()
        return func(*args, **(kwargs or {}))


def reduction_stats(engine: Engine, count_comms: bool, step: int) -> tuple[torch.Tensor, dict]:
    """Step ``step``'s forward/backward and gradient sync, with the collectives it issued:
    ``comms`` (every c10d collective, from CommDebugMode; only with ``count_comms``) and the
    gradient reducer's buckets, launches, and launches made from a backward hook."""
    mode = CollectiveCounter()
    if count_comms:
        with mode:
            local_loss = engine.forward_backward(step)
    else:
        local_loss = engine.forward_backward(step)
    reducer = getattr(engine.data_parallel, "reducer", None)
    stats = {
        "comms": mode.count if count_comms else None,
        "comm_bytes": mode.bytes if count_comms else None,
        "buckets": len(reducer.buckets) if reducer else 0,
        "collectives": reducer.collectives if reducer else 0,
        "in_backward": sum(b.in_backward for b in reducer.buckets) if reducer else 0,
        "backwards": reducer.rounds if reducer else 0,  # micro-batches x accumulation rounds
        "per_round": reducer.per_round if reducer else False,
    }
    return local_loss, stats


def run_layout(overrides: list[str], world_size: int, count_comms: bool = False) -> tuple[dict, weakref.ref]:
    """Train one layout; returns losses, grad norms, step-1 gradients, state bytes and step 2's
    gradient-reduction statistics, and a weak reference to the engine's ZeRO strategy."""
    cfg = load_config(None, overrides)
    dims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], world_size)
    mesh = build_mesh(dims, torch.device("cpu"))
    engine = Engine(cfg, dims, mesh, torch.device("cpu"))
    groups = {dim: dist.get_process_group_ranks(mesh[dim].get_group()) for dim in mesh.mesh_dim_names}
    compute_dtypes: set[str] = set()  # dtypes of a block's weights as its forward sees them

    def record_dtypes(module, args) -> None:
        compute_dtypes.update(str(p.dtype) for p in module.parameters())

    first_block = next(iter(engine.chunks[0].blocks.values()))
    hook = first_block.register_forward_pre_hook(record_dtypes)  # after ZeRO-3's all-gather hook
    losses, norms, grads, stats = [], [], {}, {}
    for step in range(1, cfg.train.steps + 1):
        if step == 2:
            local_loss, stats = reduction_stats(engine, count_comms, step)
        else:
            local_loss = engine.forward_backward(step)
        loss, norm = engine.reduce_loss_and_norm(local_loss)
        if step == 1:
            grads = engine.full_gradients()
        if step == 2 and count_comms:  # the optimizer step's own collectives (ZeRO-1/2: the all-gathers)
            with CollectiveCounter() as counter:
                engine.optimizer_step()
            stats["step_comms"] = counter.count
            stats["step_comm_bytes"] = counter.bytes
        else:
            engine.optimizer_step()
        losses.append(loss)
        norms.append(norm)
    hook.remove()
    result = {
        "losses": losses,
        "grad_norms": norms,
        "grads": grads,
        "mem": engine.state_bytes(),
        "groups": groups,
        "dims": spelling(dims, pipeline=False),
        "reduction": stats,
        "compute_dtypes": sorted(compute_dtypes),
        # what the model holds and what the optimizer updates (its master weights)
        "param_dtypes": sorted({str(p.dtype) for p in engine.data_parallel.params}),
        "optimizer_dtypes": sorted(
            {str(p.dtype) for group in engine.data_parallel.optimizer.param_groups for p in group["params"]}
        ),
        "compiled_blocks": sum(is_compiled(b) for chunk in engine.chunks for b in chunk.blocks.values()),
        # the classes of the vocabulary tables this rank's stages have (ZeRO-3 may shard them over dp)
        "vocab_tables": sorted({type(t).__name__ for c in engine.chunks for t in (c.tok_emb, c.head) if t is not None}),
    }
    return result, weakref.ref(engine.data_parallel)


def main(out_dir: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    for name, overrides in spec["layouts"].items():
        result, strategy = run_layout(spec["base"] + overrides, env.world_size, spec.get("count_comms", False))
        gc.collect()
        result["strategy_freed"] = strategy() is None  # the engine is gone: nothing may keep it alive
        torch.save(result, Path(out_dir) / f"{name}.rank{env.rank}.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_process(0)  # as an engine rank ends: no collective in flight can abort the exit
