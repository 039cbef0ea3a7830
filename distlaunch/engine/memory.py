"""Bytes of training state a rank really holds, measured from tensor storages.

Each storage counts once: ZeRO-1/2 optimise views into the parameters' own storage, and the
stage-1 gradient slice lives inside the full gradient, so summing ``numel * element_size`` per
tensor would double count. A category only counts storages no earlier category claimed
(order: params, grads, optimizer).
"""

from __future__ import annotations

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
