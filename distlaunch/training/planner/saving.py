"""How long the bundled engine may take to save a checkpoint it is asked for, from the config alone (pure
arithmetic, no torch): how far ahead of a Slurm time limit ``distlaunch slurm sbatch`` has the job warned
(``#SBATCH --signal=B:USR1@LEAD``), and how long a Kubernetes pod is given to stop
(``terminationGracePeriodSeconds``).

The estimate is an upper bound built from two parts, each with a constant chosen on the slow side:

- **the save**: the bytes the busiest node writes for one checkpoint, over ``WRITE_BYTES_PER_S``, plus
  ``SAVE_OVERHEAD_S`` (the barriers, ``meta.json``, the rename). A node writes at most what its ranks hold
  (fp32 weights and AdamW's moments: the checkpoint keeps no 16-bit copy) and never more than the whole
  checkpoint, since DCP writes a replicated tensor once.
- **the steps before it**: ``SAVE_STEPS`` steps, the one under way when the request comes and the one after
  which the ranks agree on it (a rank may see the request a step after another). The planner knows no step
  time, so a step is timed from its FLOPs (the PaLM count, as the engine's MFU) at a conservative throughput
  per rank, plus ``STEP_OVERHEAD_S`` for what FLOPs do not count (collectives, the optimizer, Python); a
  ``fault.kind=slow`` rehearsal multiplies it by ``fault.factor``.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

from distlaunch.contract.layout import place_of
from distlaunch.readable import plural
from distlaunch.training.argv import ENGINE_MODULE, engine_args, engine_job, is_engine
from distlaunch.training.config import TrainingConfig
from distlaunch.training.dims import ParallelDims
from distlaunch.training.planner.shapes import FP32, rank_tensors, stage_tensors, state_bytes
from distlaunch.training.precision import model_dtype_name
from distlaunch.training.presets import GPTConfig

# One node writing to a shared file system (NFS over 10 GbE, a busy Lustre client): the write and the SHA-256
# every saved file gets. Parallel file systems give a node several GB/s; a slower guess only warns earlier.
WRITE_BYTES_PER_S = 200e6
SAVE_OVERHEAD_S = 2.0
# Sustained training FLOP/s of one rank, far below the hardware's peak (an A100's bf16 peak is 312e12, its fp32
# 19.5e12; a CPU core's fp32 some 50e9): a model that reaches more only saves sooner than planned.
GPU_FLOPS_PER_S = {"bf16": 30e12, "fp16": 30e12, "fp32": 5e12}
CPU_FLOPS_PER_S = 5e9
STEP_OVERHEAD_S = 0.5
SAVE_STEPS = 2
ADAM_MOMENTS = 2
DEFAULT_SAVE_S = 120  # a program other than the bundled engine, which distlaunch cannot look into: two minutes


class SaveEstimate(BaseModel):
    """The seconds from a save request to the saved checkpoint, and what they are made of."""

    checkpoint_bytes: int  # the whole checkpoint: fp32 weights, AdamW moments and step counters
    node_bytes: int  # the most one node writes of it
    write_bytes_per_s: float
    save_s: float  # node_bytes / write_bytes_per_s + SAVE_OVERHEAD_S
    step_flops: float  # one training step, every rank together
    rank_flops_per_s: float  # assumed sustained throughput of one rank
    step_s: float  # step_flops / (world size x rank_flops_per_s) + STEP_OVERHEAD_S, x fault.factor
    steps: int  # steps that may run before the save starts
    seconds: float  # save_s + steps x step_s

    def describe(self) -> str:
        """``save 9.8 s (1.6 GB at 200 MB/s + 2 s) + 2 steps × 1.3 s``."""
        return (
            f"save {self.save_s:.1f} s ({self.node_bytes / 1e9:.2g} GB at {self.write_bytes_per_s / 1e6:g} MB/s + "
            f"{SAVE_OVERHEAD_S:g} s) + {plural(self.steps, 'step')} × {self.step_s:.2f} s"
        )


def model_numel(model: GPTConfig) -> int:
    """Parameters of the whole model (one stage holding everything, no tensor parallel)."""
    return sum(t.numel for t in stage_tensors(model, 0, 1, 1))


def checkpoint_bytes(model: GPTConfig) -> int:
    """A checkpoint's tensors: fp32 weights, two AdamW moments per weight and a 4-byte step per tensor."""
    tensors = stage_tensors(model, 0, 1, 1)
    return (1 + ADAM_MOMENTS) * FP32 * model_numel(model) + FP32 * len(tensors)


def rank_save_bytes(model: GPTConfig, dims: ParallelDims, rank: int, precision: str) -> int:
    """What one rank holds of the checkpoint: its optimizer state, and its weights where they are fp32 (16-bit
    weights are saved from their fp32 masters, which the optimizer state holds)."""
    place = place_of(dims, rank)
    dp_rank, pp_rank = place["dp"], place["pp"]
    params, _, optimizer = state_bytes(rank_tensors(model, dims, pp_rank), dims.zero, dims.dp, dp_rank, precision)
    fp32_weights = dims.zero == 3 or model_dtype_name(precision, dims.zero) == "fp32"
    return optimizer + (params if fp32_weights else 0)


def node_save_bytes(model: GPTConfig, dims: ParallelDims, precision: str, ranks_per_node: int) -> int:
    """The most one node writes: what its ranks hold (block placement, rank // ranks_per_node), at most the whole
    checkpoint."""
    per_node = max(1, ranks_per_node)
    nodes = -(-dims.world_size // per_node)
    held = [
        sum(
            rank_save_bytes(model, dims, r, precision)
            for r in range(n * per_node, min((n + 1) * per_node, dims.world_size))
        )
        for n in range(nodes)
    ]
    return min(checkpoint_bytes(model), max(held))


def step_flops(model: GPTConfig, cfg: TrainingConfig) -> float:
    """Training FLOPs of one step: 6 per multiplying weight and token, plus 12·L·d·T per token for attention
    (the engine's MFU count; the embedding tables are looked up, not multiplied)."""
    seq = cfg.train.seq_len
    lookups = (model.vocab_size + model.max_seq_len) * model.d_model
    per_token = 6 * (model_numel(model) - lookups) + 12 * model.n_layer * model.d_model * seq
    return float(per_token * cfg.train.global_batch_size * seq)


def estimate_save(
    model: GPTConfig, dims: ParallelDims, cfg: TrainingConfig, ranks_per_node: int, gpus: bool
) -> SaveEstimate:
    """The save-on-request time of this job (``gpus``: its ranks train on GPUs, else on CPU cores)."""
    precision = cfg.train.precision
    node_bytes = node_save_bytes(model, dims, precision, ranks_per_node)
    save_s = node_bytes / WRITE_BYTES_PER_S + SAVE_OVERHEAD_S
    flops = step_flops(model, cfg)
    rate = GPU_FLOPS_PER_S[precision] if gpus else CPU_FLOPS_PER_S
    step_s = flops / (dims.world_size * rate) + STEP_OVERHEAD_S
    if cfg.fault.kind == "slow" and cfg.fault.rank is not None:  # a rehearsed slow rank sets every step's pace
        step_s *= cfg.fault.factor
    return SaveEstimate(
        checkpoint_bytes=checkpoint_bytes(model),
        node_bytes=node_bytes,
        write_bytes_per_s=WRITE_BYTES_PER_S,
        save_s=round(save_s, 3),
        step_flops=flops,
        rank_flops_per_s=rate,
        step_s=round(step_s, 3),
        steps=SAVE_STEPS,
        seconds=round(save_s + SAVE_STEPS * step_s, 3),
    )


def engine_save_estimate(
    argv: list[str], parallel: str | None, world_size: int, ranks_per_node: int, gpus: bool
) -> tuple[SaveEstimate, TrainingConfig] | None:
    """The estimate for ``python -m distlaunch.engine ARGV`` on ``world_size`` ranks, with the config its ranks will
    read (the file, ``--set``, the layout ``parallel``), and that config; None when the engine would refuse ARGV
    itself (its ranks say why). A bad config or layout is the UsageError the ranks would stop with."""
    args = engine_args(True, [ENGINE_MODULE, *argv])
    if args is None:
        return None
    job = engine_job(args, parallel, world_size)
    return estimate_save(job.model, job.dims, job.cfg, ranks_per_node, gpus), job.cfg


def program_save_estimate(
    module: bool, program: list[str], parallel: str | None, world_size: int, ranks_per_node: int, gpus: bool,
    shared: str,
) -> SaveEstimate | None:  # fmt: skip
    """The estimate for a program that is the bundled engine, else None; warns when its config sets no
    ``checkpoint.dir``, which ``shared`` (a place every node sees, in words) should hold."""
    found = (
        engine_save_estimate(program[1:], parallel, world_size, ranks_per_node, gpus)
        if is_engine(module, program)
        else None
    )
    if found is None:
        return None
    estimate, cfg = found
    if cfg.checkpoint.dir is None:
        logging.getLogger("distlaunch").warning(
            "the engine's checkpoint.dir is not set: its ranks cannot save when asked before a stop "
            f"(set --set checkpoint.dir=PATH on {shared})"
        )
    return estimate
