"""Print this rank's distributed environment as one JSON line (no torch: starts fast)."""

import json
import os

KEYS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NNODES",
    "DISTLAUNCH_JOB_ID",
    "DISTLAUNCH_PARALLEL",
    "DISTLAUNCH_BACKEND",
    "DISTLAUNCH_RESTART_COUNT",
    "SLURMD_NODENAME",
    "OMP_NUM_THREADS",
)
with open(f"/proc/{os.getppid()}/comm", encoding="utf-8") as f:
    parent = f.read().strip()  # slurmstepd when distlaunch exec'd into the rank (no process in between)
print("RANKENV " + json.dumps({k: os.environ.get(k) for k in KEYS} | {"parent": parent}), flush=True)
