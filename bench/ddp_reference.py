"""The minimal reference for bench/engine_throughput.py: textbook torchrun + DistributedDataParallel.

The same GPT, initial weights, batches, AdamW settings, clipping and schedule as
``distlaunch train`` with pure data parallelism, written the way a tutorial would:

    torchrun --nproc-per-node 2 bench/ddp_reference.py --preset tiny --steps 30 \\
        --global-batch-size 16 --seq-len 128 --out ref.json

Rank 0 writes ``{"tokens_per_s": median over steps 2.., "losses": [...]}`` to ``--out``.
``Reference`` is also the DDP half of bench/step_interleaved.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from distlaunch.engine.data import BatchSampler, load_split
from distlaunch.engine.model import GPT, PRESETS, init_weights
from distlaunch.engine.optim import build_scheduler
from distlaunch.training.config import load_config

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args() -> argparse.Namespace:
    return arguments().parse_args()


def arguments() -> argparse.ArgumentParser:
    """The run's settings (bench/step_interleaved.py adds its own)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--out", required=True)
    return parser


class Reference:
    """The tutorial loop's state on one rank: DDP model, AdamW, schedule, sampler."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device
        # the engine's defaults for everything the command line does not set
        train = load_config(None, [f"train.steps={args.steps}"]).train
        model = GPT(PRESETS[args.preset]).to(device)
        init_weights(model, train.seed)
        self.model, self.ddp = model, DistributedDataParallel(model)
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=train.lr,
            betas=(train.beta1, train.beta2),
        )
        self.scheduler = build_scheduler(self.optimizer, train)
        self.grad_clip = train.grad_clip
        tokens, _ = load_split(None, "auto", "uint16", 0.1)
        self.sampler = BatchSampler(tokens, args.seq_len, args.global_batch_size, train.seed)
        self.precision = args.precision

    def step(self, step: int) -> float:
        """One training step; returns the loss."""
        x, y = (t.to(self.device) for t in self.sampler.local_batch(step, self.rank, self.world))
        self.optimizer.zero_grad(set_to_none=True)
        autocast = (
            torch.autocast(self.device.type, DTYPES[self.precision])
            if self.precision != "fp32"
            else contextlib.nullcontext()
        )
        with autocast:
            logits = self.ddp(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()  # a real loop logs the loss: one device sync per step


def init(backend: str | None = None) -> torch.device:
    """The process group (NCCL on GPUs, else gloo) and this rank's device."""
    cuda = torch.cuda.is_available()
    dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    if not cuda:
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    return device


def main() -> None:
    args = parse_args()
    reference = Reference(args, init())
    times, losses = [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        losses.append(reference.step(step))
        times.append(time.perf_counter() - start)
    if reference.rank == 0:
        tokens_per_step = args.global_batch_size * args.seq_len
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"tokens_per_s": statistics.median(tokens_per_step / t for t in times[1:]), "losses": losses}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
