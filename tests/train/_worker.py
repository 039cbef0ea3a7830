"""One rank of a training test job: several configs in one process group, each through the real
``Engine.train_step`` (accumulation, unscale, clipping, AdamW, schedule, loss scale).

For each named config it writes ``<out>/<name>.rank<r>.pt``: per-step loss, grad norm, lr,
skipped flag and loss scale, the whole parameters this rank holds after the last step, its
measured state bytes, the peak of live tensor bytes inside steps 2 and 3 (``tests/live_memory.py``), its
place in the mesh, and step 1's gradients after clipping. The single-process run (no launch
environment) also writes ``plain.pt``: the same steps done by plain PyTorch (one GPT,
``clip_grad_norm_``, AdamW), the reference for clipping.

    python tests/train/_worker.py OUT_DIR SPEC_JSON
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from distlaunch.contract.layout import spelling
from distlaunch.engine.__main__ import end_process
from distlaunch.engine.data import BatchSampler, load_split
from distlaunch.engine.memory import storage_bytes
from distlaunch.engine.model import GPT, PRESETS, init_weights
from distlaunch.engine.optim import build_scheduler, make_optimizer_factory
from distlaunch.engine.parallel.data import full_tensor
from distlaunch.engine.parallel.mesh import build_mesh, init_process_group, read_env
from distlaunch.engine.trainer import Engine
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.presets import model_config
from tests.live_memory import PeakLiveBytes, count_allocations

MEASURED_STEPS = (2, 3)  # after a warm-up step, so the optimizer state exists


def run_config(overrides: list[str], world_size: int) -> dict:
    """Train one config; returns what the tests compare."""
    cfg = load_config(None, overrides)
    dims = resolve_parallel_dims(cfg, model_config(cfg.model.preset, cfg.data.path), world_size)
    # earlier configs' garbage goes now, not inside a measured step (freezing the survivors keeps
    # the next collect short)
    gc.collect()
    gc.freeze()
    with PeakLiveBytes() as before:  # what the process holds before the engine exists
        pass
    engine = Engine(cfg, dims, build_mesh(dims, torch.device("cpu")), torch.device("cpu"))
    steps = [engine.train_step(1)]
    clipped = engine.full_gradients()  # step 1's gradients as the optimizer used them
    # bytes that are not the engine's: the process's before it, and the copies of step 1's
    # gradients kept for the test (with plain data parallelism the gradients themselves, which a
    # step would otherwise free)
    outside = before.start + storage_bytes({"params": clipped.values()})["total"]
    peaks = []
    for step in range(2, cfg.train.steps + 1):
        if step not in MEASURED_STEPS:
            steps.append(engine.train_step(step))
            continue
        with PeakLiveBytes() as live:
            steps.append(engine.train_step(step))
        peaks.append(live.peak - outside)
    params = {n: full_tensor(p).detach().clone() for chunk in engine.chunks for n, p in chunk.named_parameters()}
    return {
        "losses": [s.loss for s in steps],
        "grad_norms": [s.grad_norm for s in steps],
        "lrs": [s.lr for s in steps],
        "skipped": [s.skipped for s in steps],
        "scales": engine.scaler.scale,
        "params": params,
        "clipped_grads": clipped,
        "mem": engine.state_bytes(),
        "step_peaks": peaks,
        "dims": spelling(dims, pipeline=False),
        "rank": dist.get_rank(),
        "overrides": overrides,  # the config as it ran, for the planner's estimate of it
    }


def plain_pytorch(overrides: list[str]) -> dict:
    """The same steps in textbook PyTorch: one model, mean loss, clip_grad_norm_, AdamW, LambdaLR."""
    cfg = load_config(None, overrides)
    train = cfg.train
    model = GPT(PRESETS[cfg.model.preset])
    init_weights(model, train.seed)
    params = [(p, p.ndim >= 2) for p in model.parameters()]
    optimizer = make_optimizer_factory(train.lr, train.weight_decay, (train.beta1, train.beta2))(params)
    scheduler = build_scheduler(optimizer, train)
    tokens, _ = load_split(cfg.data.path, cfg.data.format, cfg.data.token_dtype, cfg.data.val_fraction)
    sampler = BatchSampler(tokens, train.seq_len, train.global_batch_size, train.seed)
    norms, clipped = [], {}
    for step in range(1, train.steps + 1):
        optimizer.zero_grad()
        x, y = sampler.global_batch(step)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip).item())
        if step == 1:
            clipped = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        scheduler.step()
    return {
        "grad_norms": norms,
        "clipped_grads": clipped,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def main(out_dir: str, spec_json: str) -> None:
    count_allocations()  # before anything the peaks count is made
    spec = json.loads(spec_json)
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    for name, overrides in spec["configs"].items():
        result = run_config(spec["base"] + overrides, env.world_size)
        torch.save(result, Path(out_dir) / f"{name}.rank{env.rank}.pt")
        dist.barrier()
    if spec.get("plain"):
        torch.save(plain_pytorch(spec["base"]), Path(out_dir) / "plain.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    end_process(0)  # as an engine rank ends: no collective in flight can abort the exit
