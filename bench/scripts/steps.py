"""A training loop in miniature for restart benchmarks: gloo all-reduces, a step every 0.1 s, a checkpoint (one
JSON file) every 5 steps, resumed on a restart. ``steps.py FOLDER STEPS [crash]``: with ``crash``, rank 1 exits
with code 42 at step 12 of the first try. Rank 0 appends each finished step to FOLDER/steps."""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

folder, steps, crash = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["crash"]
ckpt = folder / "ckpt.json"
dist.init_process_group("gloo")
rank, first_try = dist.get_rank(), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
start = json.loads(ckpt.read_text())["step"] + 1 if ckpt.exists() else 1
for step in range(start, steps + 1):
    if crash and first_try and rank == 1 and step == 12:
        os._exit(42)
    value = torch.ones(1024)
    dist.all_reduce(value)
    time.sleep(0.1)
    if rank == 0:
        with open(folder / "steps", "a") as f:
            f.write(f"{step}\n")
        if step % 5 == 0:
            ckpt.with_suffix(".tmp").write_text(json.dumps({"step": step}))
            ckpt.with_suffix(".tmp").replace(ckpt)
    dist.barrier()
dist.destroy_process_group()
