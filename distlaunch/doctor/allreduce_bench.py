"""All-reduce bandwidth across every rank, measured as nccl-tests' all_reduce_perf does.

    distlaunch run -H hosts -m distlaunch.doctor.allreduce_bench --max-bytes 256M   # or: distlaunch doctor --bench

For each message size S (float32 elements, sizes doubling from --min-bytes to --max-bytes) it times
``iters`` all-reduces after ``warmup`` ones and reports, as nccl-tests define them:
algbw = S / t and busbw = algbw · 2(n−1)/n (the bytes each link really carries in a ring all-reduce,
comparable across rank counts). Rank 0 prints one JSON line per size, prefixed by ``RESULT_PREFIX``.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

RESULT_PREFIX = "distlaunch-bench "
ELEMENT = 4  # bytes of a float32


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes from min to max, doubling, each a whole number of float32 elements."""
    out, size = [], max(min_bytes, ELEMENT)
    while size <= max_bytes:
        out.append(size - size % ELEMENT)
        size *= 2
    return out


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n−1)/n."""
    return 2 * (world_size - 1) / world_size


def iterations(size: int) -> tuple[int, int]:
    """(warmup, timed) iterations: many for small messages, where one call is noise, few for large ones."""
    timed = max(3, min(50, (64 << 20) // max(size, 1)))
    return max(1, timed // 5), timed


def measure(size: int, device: torch.device) -> float:
    """Seconds per all-reduce of ``size`` bytes (the slowest rank's average: what the job waits for)."""
    buf = torch.ones(size // ELEMENT, dtype=torch.float32, device=device)
    warmup, timed = iterations(size)
    for _ in range(warmup):
        dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(timed):
        dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / timed], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def parse_bytes(text: str) -> int:
    """``1K``, ``16M``, ``256MiB``, ``1048576`` → bytes (binary units, as nccl-tests' -b/-e)."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="1K", type=parse_bytes)
    parser.add_argument("--max-bytes", default="256M", type=parse_bytes)
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if backend == "nccl" else "cpu")
    for size in sizes(args.min_bytes, args.max_bytes):
        seconds = measure(size, device)
        algbw = size / seconds / 1e9  # GB/s, decimal as nccl-tests
        if rank == 0:
            print(
                RESULT_PREFIX
                + json.dumps(
                    {
                        "bytes": size,
                        "seconds": seconds,
                        "algbw_gbs": algbw,
                        "busbw_gbs": algbw * bus_factor(world),
                        "world_size": world,
                        "backend": backend,
                    }
                ),
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
