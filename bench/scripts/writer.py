"""Writes RATE_MIB MiB/s of 200-byte lines (0: as fast as it can) for SECONDS s, then exits 0."""

import os
import sys
import time

rate = float(os.environ["RATE_MIB"]) * (1 << 20)
seconds = float(os.environ["SECONDS_"])
line = b"z" * 199 + b"\n"
batch = line * 64
out = sys.stdout.buffer
start = time.monotonic()
written = 0
while (now := time.monotonic()) - start < seconds:
    if rate and written > rate * (now - start):
        time.sleep(0.005)
        continue
    out.write(batch)
    written += len(batch)
out.flush()
