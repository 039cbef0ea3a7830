"""A real all-reduce across every rank, written exactly as for torchrun.

    distlaunch run -n 4 -m distlaunch.examples.allreduce

Each rank contributes ``rank + 1``; after the all-reduce every rank holds 1 + 2 + … + world_size.
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")  # reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if backend == "nccl" else "cpu")
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = world_size * (world_size + 1) / 2
    print(
        f"rank {rank}/{world_size} ({backend}): all_reduce(sum of rank+1) = {value.item():g} "
        f"({'ok' if value.item() == expected else f'WRONG, expected {expected:g}'})"
    )
    dist.barrier()
    dist.destroy_process_group()
    if value.item() != expected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
