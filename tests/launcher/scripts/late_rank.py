"""Four gloo ranks all_reduce; rank LATE_RANK sleeps first (a hang the launcher must explain)."""

import os
import time

print("starting", flush=True)  # output is progress: the quiet import below must not look like the hang

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
if rank == int(os.environ["LATE_RANK"]):
    time.sleep(600)  # the odd one out
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} sum {t.item()}", flush=True)
