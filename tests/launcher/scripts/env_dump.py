"""Print this rank's launch environment as one JSON line."""

import json
import os
import sys

KEYS = [
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
    "DISTLAUNCH_RESTART_COUNT",
    "OMP_NUM_THREADS",
    "EXTRA",
]
print("ENV " + json.dumps({"argv": sys.argv[1:], **{k: os.environ.get(k) for k in KEYS}}))
