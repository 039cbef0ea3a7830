"""Four gloo ranks all_reduce; rank LATE_RANK sleeps first (a hang the launcher must explain)."""

import os
import threading
import time

# Output is progress: until this rank has joined, a line every 2 s, so that importing torch on a
# loaded machine (seconds, silent) never looks like the hang, which starts once every rank is quiet
joined = threading.Event()


def starting() -> None:
    print("starting", flush=True)
    while not joined.wait(2):
        print("starting", flush=True)


threading.Thread(target=starting, daemon=True).start()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} joined", flush=True)
joined.set()
if rank == int(os.environ["LATE_RANK"]):
    time.sleep(600)  # the odd one out
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} sum {t.item()}", flush=True)
