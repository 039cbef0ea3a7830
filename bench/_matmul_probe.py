"""A short matmul probe, as a preflight measures one device's sustained compute: the model's widest matmul
(``tokens`` x ``d`` by ``d`` x ``4d``, the MLP's first projection) repeated for about ``seconds``, in fp32, on
one thread. Prints the FLOP/s it sustained.

    python bench/_matmul_probe.py --d-model 128 --tokens 1024 --seconds 2
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    a = torch.randn(args.tokens, args.d_model)
    b = torch.randn(args.d_model, 4 * args.d_model)
    flops = 2 * args.tokens * args.d_model * 4 * args.d_model
    for _ in range(3):  # warm-up: the allocator, the kernel's first call
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        a @ b
        count += 1
    print(count * flops / (time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
