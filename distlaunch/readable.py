"""Numbers as a person reads them at a glance, the same in the launcher's status line and the engine's lines:
counts, rank ranges, durations, time left, rates. Standard library only: the engine and the launcher both use it."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None, *, grouped: bool = False) -> str:
    """``1 rank``, ``4 ranks``; ``many``: the plural where adding an s is wrong (``1 process``, ``2 processes``);
    ``grouped``: the count with thousands separators (``1,204,311 tokens``). Every count distlaunch prints with
    its noun goes through here, so that none says "1 ranks" or hedges with "rank(s)"."""
    shown = f"{count:,}" if grouped else str(count)
    return f"{shown} {noun if count == 1 else many or noun + 's'}"


def ranges(ranks: list[int]) -> str:
    """Ranks as ranges, at a glance: [0, 1, 2, 4] -> '0-2,4'."""
    parts, ranks = [], sorted(ranks)
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ",".join(parts)


def clock(seconds: float) -> str:
    """Elapsed time: 0:31, 12:05, 3:02:10."""
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def time_left(seconds: float) -> str:
    """A duration, short: 45s, 3m05s, 2h03m."""
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def rate(per_s: float) -> str:
    """A rate in at most five characters: 912, 10.6k, 1.23M."""
    if per_s < 1000:
        return f"{per_s:.0f}"
    if per_s < 1e6:
        return f"{per_s / 1e3:.3g}k"
    return f"{per_s / 1e6:.3g}M"
