"""Peak bytes of live CPU allocations over a block of code, from the allocator's own events.

The CPU has no counter like CUDA's ``max_memory_allocated``, and the process RSS mixes in the
C allocator's caching. The profiler's memory events are every allocation and free the CPU
allocator made (on the calling thread), in order; their running sum is the live bytes, and its
maximum the peak, relative to what was live when the block began.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.profiler import ProfilerActivity, profile


class Peak:
    """Filled in when the ``allocation_peak`` block ends."""

    bytes: int = 0  # the highest live total inside the block, above its start
    end_bytes: int = 0  # still live at the end, above the start


@contextlib.contextmanager
def allocation_peak() -> Iterator[Peak]:
    """``with allocation_peak() as peak: ...`` then read ``peak.bytes``."""
    peak = Peak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield peak
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = 0
    for _, delta in events:
        live += delta
        peak.bytes = max(peak.bytes, live)
    peak.end_bytes = live
