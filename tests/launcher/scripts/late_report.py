"""Rank 1 crashes first, but its report reaches the launcher last; rank 0 fails because of it, later.

Rank 1 leaves a child holding its output pipes (its agent then waits a second for their end before it
reports the exit), tells rank 0 through CRASHED_FILE, and exits 42. Rank 0 exits 1 a moment later, as a
peer whose collective broke would, and its report arrives first; with PEER=waits it waits to be stopped.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
crashed = Path(os.environ["CRASHED_FILE"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    subprocess.Popen(["sleep", "30"])  # in the rank's process group: the agent ends it with the rank
    print("rank 1 crashes now", file=sys.stderr, flush=True)
    crashed.touch()
    os._exit(42)
while not crashed.exists():
    time.sleep(0.01)
if os.environ.get("PEER") == "waits":
    time.sleep(600)
time.sleep(0.2)
print("rank 0: my peer is gone", file=sys.stderr, flush=True)
sys.exit(1)
