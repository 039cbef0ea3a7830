"""How long a rank computes in a step: the CPU time of its stepping thread, less what it spent waiting for
other ranks.

A slow rank (a throttled processor, a slower host) makes every peer wait for it in the next collective, so every
rank's step takes as long; what tells them apart is the time each spends computing, outside collectives. That is
what the loop reports every step (``distlaunch.progress(compute_s=...)``) and the launcher compares to name a
straggler.

It is the thread's CPU time (``time.thread_time``), not its wall time: a rank blocked in a collective uses none,
and neither does a rank the kernel has set aside for another process. On a busy machine (2 cores, 2 ranks and a
CPU-burning process) the wall time outside collectives made one healthy rank look 2.2 times slower than the
other, as the burner shared its core; the CPU time kept the ranks within 1.3 of each other. The engine's own
waits are taken out besides, in case a transport spins while it waits: the async work handles of the gradient
buckets and of ZeRO's parameter all-gathers (``watchdog.wait_for_peers``) and its blocking collectives (the loss
and gradient-norm all-reduce, evaluation), under ``waiting()``. Collectives that PyTorch issues inside its own
modules (tensor parallel's DTensor ones, ``fully_shard``'s, the pipeline's sends and receives) block the same way
and cost no CPU time either.

On an accelerator the device computes, not the host, which runs ahead of it: ``StepClock`` measures only on the
CPU and reports None elsewhere (the straggler watch then has nothing to compare, and says nothing). With several
intra-op threads per rank (one rank on a many-core host), the stepping thread's share of the work stands for it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the watchdog imports this module: it stays torch-free
    import torch


class _Waits:
    total_s = 0.0  # CPU seconds the stepping thread spent waiting for other ranks so far


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Count the block as waiting for other ranks, not computing."""
    start = time.thread_time()
    try:
        yield
    finally:
        _Waits.total_s += time.thread_time() - start


class StepClock:
    """Times one step at a time (``with clock: ...``); then ``compute_s`` is its compute time (None off the CPU)."""

    def __init__(self, device: torch.device):
        self.measures = device.type == "cpu"
        self.compute_s: float | None = None
        self._start = self._waited = 0.0

    def __enter__(self) -> StepClock:
        self._start, self._waited = time.thread_time(), _Waits.total_s
        return self

    def __exit__(self, *exc: object) -> None:
        spent = time.thread_time() - self._start
        self.compute_s = max(spent - (_Waits.total_s - self._waited), 0.0) if self.measures else None


def spin(cpu_s: float) -> None:
    """Compute for ``cpu_s`` seconds of this thread's CPU time (what a slower processor would add to a step)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass
