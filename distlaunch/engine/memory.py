"""Bytes of training state a rank really holds, measured from tensor storages; the process's peak
resident memory; and how host memory freed by tensors goes back to the system.

Each storage counts once: ZeRO-1/2 optimise views into the parameters' own storage, and the
stage-1 gradient slice lives inside the full gradient, so summing ``numel * element_size`` per
tensor would double count. A category only counts storages no earlier category claimed
(order: params, grads, optimizer).
"""

from __future__ import annotations

import ctypes
import resource
import sys
from collections.abc import Iterable

import torch

CATEGORIES = ("params", "grads", "optimizer")


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr())


def storage_bytes(state: dict[str, Iterable[torch.Tensor]]) -> dict[str, int]:
    """``{"params": bytes, "grads": bytes, "optimizer": bytes, "total": bytes}`` for ``state``."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, int] = {}
    for category in CATEGORIES:
        total = 0
        for t in state.get(category, ()):
            storage = t.untyped_storage()
            key = _storage_key(t)
            if storage.nbytes() == 0 or key in seen:
                continue  # freed (FSDP resizes unsharded storage to 0) or already counted
            seen.add(key)
            total += storage.nbytes()
        out[category] = total
    out["total"] = sum(out[c] for c in CATEGORIES)
    return out


def device_peak_bytes(device: torch.device) -> int | None:
    """Peak bytes the CUDA caching allocator handed out, or None on CPU (no such counter)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 4 * 2**20
TRIM_THRESHOLD = 64 * 2**20


def return_freed_host_memory() -> None:
    """Serve host allocations of 4 MiB and more from their own mappings, which go back to the
    system when the tensor is freed.

    glibc's default threshold grows to 32 MiB as large blocks are freed, after which a freed
    gathered unit, gradient or gloo buffer stays in the heap of the thread that allocated it (gloo
    allocates on its own threads), where only that thread reuses it: a ZeRO-3 rank of the 125m
    preset resided at 2.0-2.4 GiB after two steps while its live tensors were 625 MiB
    (docs/benchmarks.md, "Engine memory"). A fixed threshold keeps the resident memory to the live tensors plus the heap of the
    small ones, for the cost of fresh pages for each large tensor. Not glibc: left as it is.

    A fixed threshold also stops the trim threshold from growing with it: it stays at 128 KiB, so
    every free that leaves more than that unused at the top of a heap hands it back to the system,
    and the next step faults the same pages in again, zeroed. Every step frees and allocates the
    same tensors under 4 MiB, so that cost 5-7% of a dp=2 step of the tiny preset on 2 cores
    (docs/benchmarks.md, "Engine throughput"). Up to ``TRIM_THRESHOLD`` unused at a heap's top now
    stays for the next step.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def peak_rss_bytes() -> int | None:
    """The most this process has resided in memory so far (the kernel's high-water mark), or None
    where the platform does not say.

    Linux: ``VmHWM`` of /proc/self/status, this process's own. ``ru_maxrss`` is not: it keeps the
    high-water mark of the process that forked it (a 600 MiB test runner, a launcher), so every
    rank would read at least its parent's peak.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (AttributeError, OSError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, elsewhere KiB
