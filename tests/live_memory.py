"""Live CPU tensor bytes of a whole process, as the CPU allocator itself counts them.

Once its ``caffe2_report_cpu_memory_usage`` flag is on, c10's CPU allocator keeps a running total
of the bytes it has handed out and not taken back, over every thread (a gloo worker freeing a
buffer included). The profiler's memory events (``profile_memory=True``) carry that total at each
allocation and free of a recorded thread, so the largest total seen in a window is the bytes of
tensors alive at its peak: no allocator cache, no RSS noise. Blocks made before the flag was set
are not in the total, so ``count_allocations`` comes first, before anything worth counting.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch.autograd.profiler import profile


def count_allocations(on: bool = True) -> None:
    """Turn the CPU allocator's running total on (or off) for this process."""
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = on


class PeakLiveBytes:
    """``with PeakLiveBytes() as w: ...``; then ``w.start`` (live bytes on entry) and ``w.peak``
    (the most alive at any instant inside)."""

    def __init__(self) -> None:
        # the autograd profiler: torch.profiler.profile would first import torch._dynamo (seconds)
        self._prof = profile(profile_memory=True)
        self.start = self.peak = 0

    def __enter__(self) -> PeakLiveBytes:
        self._prof.__enter__()
        torch.empty(1, dtype=torch.uint8)  # the first event: the total on entry, less its 1 byte
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        events = []  # (time, signed bytes, running total after it)
        stack = list(self._prof.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            fields = node.extra_fields
            if type(fields).__name__ == "_ExtraFields_Allocation" and fields.device.type == "cpu":
                events.append((node.start_time_ns, fields.alloc_size, fields.total_allocated))
        events.sort(key=lambda e: e[0])
        _, size, total = events[0]
        self.start = total - size
        self.peak = max(total for _, _, total in events)


def nearest_peak(planned: int, step_peaks: list[int]) -> int:
    """The measured step peak a plan is held to: the one nearest it. Steps of one run differ by
    about one collective buffer now and then (whether a gloo worker has released its copy, or an
    async all-gather's buffer is alive yet, at the peak's instant), either way; the plan counts
    the moment once, so it must match one of the steps, not the luckier or unluckier of them."""
    return min(step_peaks, key=lambda peak: abs(planned - peak))
