"""The minimal reference for bench/engine_throughput.py: textbook torchrun + DistributedDataParallel.

The same GPT, initial weights, batches, AdamW settings, clipping and schedule as
``distlaunch train`` with pure data parallelism, written the way a tutorial would:

    torchrun --nproc-per-node 2 bench/ddp_reference.py --preset tiny --steps 30 \\
        --global-batch-size 16 --seq-len 128 --out ref.json

Rank 0 writes ``{"tokens_per_s": median over steps 2.., "losses": [...]}`` to ``--out``.
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

from distlaunch.engine.config import load_config
from distlaunch.engine.data import BatchSampler, load_split
from distlaunch.engine.model import GPT, PRESETS, init_weights
from distlaunch.engine.optim import build_scheduler

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # the engine's defaults for everything the command line does not set
    train = load_config(None, [f"train.steps={args.steps}"]).train
    model = GPT(PRESETS[args.preset]).to(device)
    init_weights(model, train.seed)
    ddp = DistributedDataParallel(model)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train.lr,
        betas=(train.beta1, train.beta2),
    )
    scheduler = build_scheduler(optimizer, train)
    tokens, _ = load_split(None, "auto", "uint16", 0.1)
    sampler = BatchSampler(tokens, args.seq_len, args.global_batch_size, train.seed)
    autocast = (
        torch.autocast(device.type, DTYPES[args.precision]) if args.precision != "fp32" else contextlib.nullcontext()
    )
    times, losses = [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        x, y = (t.to(device) for t in sampler.local_batch(step, rank, world))
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = ddp(x)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())  # a real loop logs the loss: one device sync per step
        times.append(time.perf_counter() - start)
    if rank == 0:
        tokens_per_step = args.global_batch_size * args.seq_len
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"tokens_per_s": statistics.median(tokens_per_step / t for t in times[1:]), "losses": losses}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
