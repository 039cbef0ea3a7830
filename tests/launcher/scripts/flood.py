"""Output faults. FLOOD: every rank but FAIL_RANK prints lines without end, FAIL_RANK exits FAIL_CODE after
FAIL_AFTER s. BIGLINE: rank 0 prints one line of BIG_MIB MiB, then "after-big". PROGRESS: a \\r progress bar."""

import os
import sys
import time

rank = int(os.environ["RANK"])
mode = os.environ["MODE"]
out = sys.stdout.buffer
if mode == "FLOOD":
    if rank == int(os.environ.get("FAIL_RANK", "-1")):
        time.sleep(float(os.environ.get("FAIL_AFTER", "3")))
        print(f"rank {rank} failing now", file=sys.stderr, flush=True)
        sys.exit(int(os.environ["FAIL_CODE"]))
    line = f"rank {rank} floods ".encode() + b"x" * 200 + b"\n"
    while True:
        out.write(line * 64)
elif mode == "BIGLINE":
    if rank == 0:
        chunk = b"y" * (1 << 20)
        for _ in range(int(os.environ["BIG_MIB"])):
            out.write(chunk)
        out.write(b"\nafter-big\n")
        out.flush()
elif mode == "PROGRESS":
    out.write(b"progress 10%\rprogress 20%\r")
    out.flush()
    time.sleep(600)
