"""Fails on the first try (DISTLAUNCH_RESTART_COUNT=0) and succeeds after a restart."""

import os
import sys

count = int(os.environ["DISTLAUNCH_RESTART_COUNT"])
print(f"rank {os.environ['RANK']} try {count}")
if count == 0 and os.environ["RANK"] == "1":
    sys.exit(3)
