"""Rank FAIL_RANK exits FAIL_CODE after printing; the others sleep (they must be stopped by the launcher)."""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
    print(f"rank {rank} failing now", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "7")))
time.sleep(600)
