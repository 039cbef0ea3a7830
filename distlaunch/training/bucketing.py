"""Which parameters share a gradient bucket (ZeRO-0/1/2).

Torch-free, so the launcher's memory planner (``training/planner``) cuts exactly the buckets the
engine's reducer (``parallel/buckets.py``) will.
"""

from __future__ import annotations

# ZeRO-1/2 all-gather the updated parameters bucket by bucket after the optimizer step, at most this
# many at a time: two overlap one bucket's copy-out with the next one's transfer
GATHERS_IN_FLIGHT = 2

# Backends whose reduce-scatter is an all-reduce of a copy of its input, then a copy of this rank's part
# out (gloo): there ZeRO-1 all-reduces its packed gradients in place instead, and ZeRO-3's units
# all-reduce FSDP's buffer in place. The same bytes on the wire, without the copy.
ALL_REDUCE_BACKENDS = ("gloo",)


def cut_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of one model chunk's parameters (``nbytes``: their gradients' bytes, in definition
    order) cut into buckets of at most ``bucket_bytes``, in reverse definition order (roughly the
    order backward produces the gradients); a parameter larger than that gets a bucket of its own."""
    out: list[list[int]] = []
    bucket: list[int] = []
    size = 0
    for i in reversed(range(len(nbytes))):
        if bucket and size + nbytes[i] > bucket_bytes:
            out.append(bucket)
            bucket, size = [], 0
        bucket.append(i)
        size += nbytes[i]
    if bucket:
        out.append(bucket)
    return out
