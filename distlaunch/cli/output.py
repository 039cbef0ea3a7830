"""Live output of a running job: whole lines with a coloured ``[rank N]`` prefix, one write per line."""

from __future__ import annotations

import os
import sys
from typing import TextIO

_PALETTE = (36, 32, 33, 35, 34, 96, 92, 93, 95, 94)  # ANSI foreground colours, cycled by rank


def use_color(stream: TextIO) -> bool:
    """Colour on a terminal unless NO_COLOR is set; FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or stream.isatty()


class RankPrinter:
    """A launcher sink that prefixes every rank line; multi-host jobs also name the host."""

    def __init__(self, multi_host: bool, out: TextIO | None = None, err: TextIO | None = None):
        self.multi_host = multi_host
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = use_color(self.out)

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        prefix = f"[{host} rank {rank}]" if self.multi_host else f"[rank {rank}]"
        if self.color:
            prefix = f"\x1b[{_PALETTE[rank % len(_PALETTE)]}m{prefix}\x1b[0m"
        stream = self.err if fd == 2 else self.out
        stream.write(f"{prefix} {line}\n")  # a single write: lines of different ranks never mix
        stream.flush()

    def notice(self, text: str) -> None:
        msg = f"\x1b[1;33mdistlaunch:\x1b[0m {text}" if use_color(self.err) else f"distlaunch: {text}"
        self.err.write(msg + "\n")
        self.err.flush()
