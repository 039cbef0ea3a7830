"""Rank 0 fills the disk under FILL_DIR (as checkpoints in a home folder do), then every rank prints FILL_LINES
lines (2000; not LINES, which terminals set) once the disk is full; the job ends with EXIT_CODE from rank 0."""

import os
import sys
import time

rank = int(os.environ["RANK"])
if rank == 0:
    try:
        with open(os.path.join(os.environ["FILL_DIR"], "filler"), "wb") as f:
            while True:
                f.write(b"\0" * 65536)
    except OSError as exc:
        print(f"rank 0 filled the disk: {exc.strerror}", flush=True)
else:
    while not os.path.exists(os.path.join(os.environ["FILL_DIR"], "filler")):
        time.sleep(0.01)
    time.sleep(0.5)
for i in range(int(os.environ.get("FILL_LINES", "2000"))):
    print(f"rank {rank} line {i} " + "z" * 60, flush=True)
sys.exit(int(os.environ.get("EXIT_CODE", "0")) if rank == 0 else 0)
