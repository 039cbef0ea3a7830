"""Every rank fails at the same moment, on its own: each leaves a child holding its output pipes (its agent
then reports the exit a second late), so all have ended before the launcher hears of the first."""

import os
import subprocess
import sys
import time
from pathlib import Path

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
barrier = Path(os.environ["BARRIER_DIR"])
subprocess.Popen(["sleep", "30"])  # in the rank's process group: the agent ends it with the rank
(barrier / f"ready{rank}").touch()
while len(list(barrier.glob("ready*"))) < world:
    time.sleep(0.01)
print(f"rank {rank} fails", file=sys.stderr, flush=True)
sys.exit(3)
