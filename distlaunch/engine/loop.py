"""The training loop of one rank: set up, step, report, clean up."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distlaunch.engine.config import TrainingConfig
from distlaunch.engine.memory import device_peak_bytes
from distlaunch.engine.metrics import MetricsWriter, flops_per_token, peak_flops
from distlaunch.engine.model import PRESETS, num_params
from distlaunch.engine.parallel.dims import ParallelDims, resolve_parallel_dims
from distlaunch.engine.parallel.mesh import DistEnv, build_mesh, init_process_group, pick_device
from distlaunch.engine.trainer import Engine, StepResult


def step_record(engine: Engine, result: StepResult, mfu_scale: float | None) -> dict[str, Any]:
    """The per-step metrics line (DESIGN.md's keys, plus the memory breakdown)."""
    tokens = engine.cfg.train.global_batch_size * engine.cfg.train.seq_len
    tokens_per_s = tokens / result.seconds
    mem = engine.state_bytes()
    return {
        "step": result.step,
        "loss": result.loss,
        "lr": result.lr,
        "grad_norm": result.grad_norm,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * mfu_scale if mfu_scale else None,
        "mem_bytes": mem["total"],
        "mem": mem,  # rank 0's params / grads / optimizer bytes, measured from storages
        "device_peak_bytes": device_peak_bytes(engine.device),
        "step_time_s": result.seconds,
    }


def _console_line(record: dict[str, Any], steps: int) -> str:
    return (
        f"step {record['step']}/{steps} | loss {record['loss']:.4f} | grad_norm {record['grad_norm']:.3f}"
        f" | {record['tokens_per_s']:.0f} tok/s | state {record['mem_bytes'] / 2**20:.1f} MiB"
    )


def train(engine: Engine, writer: MetricsWriter, rank: int) -> dict[str, Any]:
    """Run ``train.steps`` steps; returns the summary record (identical on every rank)."""
    cfg, dims = engine.cfg, engine.dims
    peak = peak_flops(engine.device, cfg.train.precision)
    mfu_scale = flops_per_token(engine.model_cfg, cfg.train.seq_len) / (peak * dims.world_size) if peak else None
    records = []
    for step in range(1, cfg.train.steps + 1):
        record = step_record(engine, engine.train_step(step), mfu_scale)
        records.append(record)
        writer.write(record)
        if rank == 0 and (step % cfg.train.log_every == 0 or step == cfg.train.steps):
            print(_console_line(record, cfg.train.steps), flush=True)
    per_rank: list[Any] = [None] * dims.world_size
    dist.all_gather_object(per_rank, engine.state_bytes())
    # the first step includes warm-up (pipeline shape inference, allocator growth)
    steady = [r["tokens_per_s"] for r in records[1:]] or [records[0]["tokens_per_s"]]
    return {
        "event": "summary",
        "steps": cfg.train.steps,
        "final_loss": records[-1]["loss"],
        "first_loss": records[0]["loss"],
        "tokens_per_s": statistics.median(steady),
        "layout": dims.describe(),
        "world_size": dims.world_size,
        "n_params": num_params(engine.model_cfg),
        "mem_bytes_per_rank": per_rank,
    }


def run(cfg: TrainingConfig, env: DistEnv, metrics_file: Path | None) -> dict[str, Any]:
    """Validate the layout, start the process group, train, and tear down."""
    dims: ParallelDims = resolve_parallel_dims(cfg, PRESETS[cfg.model.preset], env.world_size)
    device = pick_device(env.local_rank)
    init_process_group(env, device)
    writer = MetricsWriter(metrics_file, enabled=env.rank == 0)
    try:
        engine = Engine(cfg, dims, build_mesh(dims, device), device)
        writer.write({"event": "start", "layout": dims.describe(), "world_size": dims.world_size,
                      "device": str(device), "config": cfg.model_dump()})
        summary = train(engine, writer, env.rank)
        writer.write(summary)
        return summary
    finally:
        writer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()
