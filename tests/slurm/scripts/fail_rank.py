"""Rank ``argv[1]`` exits with code ``argv[2]`` at once; every other rank sleeps until it is stopped."""

import os
import sys
import time

if os.environ["RANK"] == sys.argv[1]:
    print(f"rank {sys.argv[1]} fails with {sys.argv[2]}", flush=True)
    sys.exit(int(sys.argv[2]))
time.sleep(120)
