"""A rank that plays PyTorch's NCCL flight recorder (no GPU needed): its dump goes where the agent's
variables say, as ``<TORCH_FR_DUMP_TEMP_FILE><rank>``, then it hangs.

rank 0: dumps at once (as NCCL's own collective timeout does);
rank 1: makes ``<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`` and dumps when something is written to it, as
        the NCCL watchdog does;
rank 2: dumps more than an agent sends (it is cut);
rank 3: no dump.
"""

import os
import random
import sys
import threading
import time

SIZES = {0: 300_000, 1: 1 << 20, 2: (4 << 20) + 12345}


def dump_bytes(rank: int) -> bytes:
    """Every byte value, in a pattern of this rank's own (the test computes the same)."""
    return random.Random(rank).randbytes(SIZES[rank])


def write_dump(rank: int) -> None:
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
        f.write(dump_bytes(rank))


def serve_pipe(rank: int) -> None:
    path = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        try:
            if os.read(fd, 128):
                write_dump(rank)
        except BlockingIOError:
            pass
        time.sleep(0.1)


if __name__ == "__main__":
    rank = int(os.environ["RANK"])
    if rank in (0, 2):
        write_dump(rank)
    elif rank == 1:
        threading.Thread(target=serve_pipe, args=(rank,), daemon=True).start()
    print(f"rank {rank} waits", flush=True)
    time.sleep(600)
    sys.exit(1)
